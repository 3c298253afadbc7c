package cli_test

import (
	"context"
	"database/sql"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
