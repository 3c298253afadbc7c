package cli_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
	_ "modernc.org/sqlite"
)

// fenceService is a participating service's gate on its own SQLite file, with resources
// given marks, serving its fence endpoint.
func fenceService(t *testing.T, resources ...string) (*gate.Gate, string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "service.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	g, err := gate.New(db, gate.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, r := range resources {
		if err := g.Add(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(g.FenceHandler())
	t.Cleanup(srv.Close)
	return g, srv.URL
}

// run --fence raises the service's mark before the command starts, and the command gets the
// token and the header value in its environment; after an epoch bump, with a resource name
// that needs escaping.
func TestRunFence(t *testing.T) {
	tg := runTarget(t)
	const res = "nightly job ü; v2"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	tg.ok(nil, "epoch", "bump")
	g, url := fenceService(t, res)
	tg.ok(nil, "run", res, "--ttl", "30s", "--fence", url, "--",
		"sh", "-c", `echo "$FENCED_EPOCH|$FENCED_TOKEN|$FENCED_TOKEN_HEADER"`)
	got := string(tg.ok(nil, "get", res))
	parts := strings.Split(strings.TrimSuffix(got, "\n"), "|")
	if len(parts) != 3 {
		t.Fatalf("the command printed %q", got)
	}
	token, err := fenced.ParseToken(parts[1])
	if err != nil || token.Generation != 1 || parts[0] != strconv.FormatInt(token.Epoch, 10) || token.Epoch < 1e15 {
		t.Fatalf("FENCED_EPOCH %q, FENCED_TOKEN %q: %v", parts[0], parts[1], err)
	}
	if want := destination.FormatHeader(res, token); parts[2] != want {
		t.Fatalf("FENCED_TOKEN_HEADER %q, want %q", parts[2], want)
	}
	if m, err := g.Mark(context.Background(), res); err != nil || m != token {
		t.Fatalf("mark %s %v, want %s", m, err, token)
	}
}

// A service that cannot be fenced stops the command before it starts, with its exit code, and
// the lease is released.
func TestRunFenceRefused(t *testing.T) {
	tg := runTarget(t)
	marker := filepath.Join(tg.dir, "ran")
	ahead, aheadURL := fenceService(t, "job")
	if err := ahead.Fence(context.Background(), "job", fenced.Token{Epoch: 1 << 62, Generation: 1}); err != nil { // far beyond any clock epoch
		t.Fatal(err)
	}
	_, emptyURL := fenceService(t)
	closed := httptest.NewServer(nil)
	closed.Close()
	for _, c := range []struct {
		name string
		code int
		url  string
		want string
	}{
		{"newer token at the service", 5, aheadURL, "older than the destination's 4611686018427387904.1"},
		{"unknown resource", 4, emptyURL, "unknown resource"},
		{"unreachable", 1, closed.URL, "connection refused"},
		{"not a URL", 2, "ftp://x", "invalid --fence"},
	} {
		stderr := tg.fails(c.code, nil, "run", "job", "--ttl", "30s", "--fence", c.url, "--", "touch", marker)
		if !strings.Contains(stderr, c.want) {
			t.Errorf("%s: stderr %q does not say %q", c.name, stderr, c.want)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s: the command ran", c.name)
		}
		if st := tg.show("job"); st.Held {
			t.Fatalf("%s: the lease was kept", c.name)
		}
	}
}

// A fence service that never answers stops the command with a clear error once the fence's
// bound, min(TTL/2, 30s), has passed, well before the lease would expire: the fence runs
// before the renewals start.
func TestRunFenceHungService(t *testing.T) {
	tg := runTarget(t)
	marker := filepath.Join(tg.dir, "ran")
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers; returns when the client gives up
	}))
	t.Cleanup(hung.Close)
	const ttl = 4 * time.Second
	start := time.Now()
	stderr := tg.fails(1, nil, "run", "job", "--ttl", ttl.String(), "--fence", hung.URL, "--", "touch", marker)
	took := time.Since(start)
	if want := "the fence service at " + hung.URL + " did not answer within 2s"; !strings.Contains(stderr, want) {
		t.Errorf("stderr %q does not say %q", stderr, want)
	}
	if took >= ttl {
		t.Errorf("fenced run took %s, the lease's TTL is %s", took, ttl)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
	if st := tg.show("job"); st.Held {
		t.Fatal("the lease was kept")
	}
}

// The gate demo: fenced on acquisition the service refuses A's stale write; without it the
// service accepts it while B owns the resource.
func TestDemoGate(t *testing.T) {
	t.Parallel()
	r := runIn(t, t.TempDir(), "", nil, "demo", "--destination", "gate")
	out := string(r.stdout)
	if r.code != 0 {
		t.Fatalf("demo: exit %d, stderr %q\n%s", r.code, r.stderr, out)
	}
	run1, run2, ok := strings.Cut(out, "== Run 2")
	if !ok {
		t.Fatalf("no second run:\n%s", out)
	}
	for _, c := range []struct {
		text string
		want *regexp.Regexp
	}{
		{run1, regexp.MustCompile(`B +fenced the service: its mark is now \d+\.2`)},
		{run1, regexp.MustCompile(`A +the service REFUSED A's write \(409: token (\d+)\.1 is older than the service's mark \d+\.2\)`)},
		{run1, regexp.MustCompile(`A +exited with code 5`)},
		{run1, regexp.MustCompile(`readers of the service now see no report`)},
		{run2, regexp.MustCompile(`A +the service ACCEPTED A's write \(204\)`)},
		{run2, regexp.MustCompile(`readers of the service now see "report by A" written with token \d+\.1, while B owns the resource`)},
		{run2, regexp.MustCompile(`B +wrote "report by B" with token \d+\.2 \(204\)`)},
		{out, regexp.MustCompile(`(?m)^Result: fenced on acquisition, the service itself refused the stale write`)},
	} {
		if !c.want.MatchString(c.text) {
			t.Errorf("no line matching %s in:\n%s", c.want, c.text)
		}
	}
	if m := regexp.MustCompile(`files in (\S+)\.\n`).FindStringSubmatch(out); m == nil {
		t.Error("the demo did not say where its files were")
	} else if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the demo left %s behind (%v)", m[1], err)
	}
	if r := runIn(t, t.TempDir(), "", nil, "demo", "--destination", "s3"); r.code != 2 || !strings.Contains(r.stderr, `invalid --destination "s3"`) {
		t.Errorf("unknown destination: exit %d, stderr %q", r.code, r.stderr)
	}
}
