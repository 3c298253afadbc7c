package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/cmd/fenced/cli"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// bin is the fenced binary under test: this test binary itself, which runs as the fenced
// command when asFenced is set in its environment (TestMain sets it for every process the
// tests start). A separate build of cmd/fenced with -race, linked before the first test could
// start, was minutes of the package's time on a loaded machine.
var bin string

// asFenced is the environment variable that makes this binary the fenced command.
const asFenced = "FENCED_CLI_TEST_AS_FENCED"

// defaultParallel is how many of this package's parallel tests run at once unless -parallel
// says otherwise. Most of them wait: on the fenced binary in a child process, on a torture run
// of fixed duration, on a server starting. GOMAXPROCS (2 on the CI machines) ran them two at a
// time and made this package most of the suite's wall time.
const defaultParallel = 3

func TestMain(m *testing.M) {
	if os.Getenv(asFenced) == "1" {
		os.Exit(cli.Process())
	}
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", strconv.Itoa(defaultParallel))
	}
	var err error
	if bin, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Every child inherits it: the tests and the fenced command start their processes with
	// this environment, or with it and more.
	if err := os.Setenv(asFenced, "1"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		// opencensus starts a worker in its package init (pulled in by the GCS client that
		// fake-gcs-server uses); it is not a goroutine a test left behind.
		if err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// result is one run of the binary.
type result struct {
	code   int
	stdout []byte
	stderr string
}

// runIn runs the binary in dir with env as FENCED_DB (unset when empty) and stdin as input.
func runIn(t *testing.T, dir, db string, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCED_DB=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if db != "" {
		cmd.Env = append(cmd.Env, "FENCED_DB="+db)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{code: cmd.ProcessState.ExitCode(), stdout: stdout.Bytes(), stderr: stderr.String()}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run fenced %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// target is one database the commands run against, selected through FENCED_DB.
type target struct {
	t   *testing.T
	url string
	dir string
	// lossy: the server is not configured for durability (the shared Redis), so every command
	// runs with --allow-nondurable and logs that warning; run drops it from stderr.
	lossy bool
}

func (tg target) run(stdin []byte, args ...string) result {
	tg.t.Helper()
	if tg.lossy {
		args = append([]string{"--allow-nondurable"}, args...)
	}
	r := runIn(tg.t, tg.dir, tg.url, stdin, args...)
	if tg.lossy {
		var kept []string
		for _, line := range strings.SplitAfter(r.stderr, "\n") {
			if !strings.Contains(line, `level=WARN msg="fenced: this database can lose acknowledged writes`) {
				kept = append(kept, line)
			}
		}
		r.stderr = strings.Join(kept, "")
	}
	return r
}

// ok runs a command that must succeed and returns its stdout.
func (tg target) ok(stdin []byte, args ...string) []byte {
	tg.t.Helper()
	r := tg.run(stdin, args...)
	if r.code != 0 || r.stderr != "" {
		tg.t.Fatalf("fenced %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// fails runs a command that must fail with code, with nothing on stdout and one sentence on
// stderr, and returns that sentence.
func (tg target) fails(code int, stdin []byte, args ...string) string {
	tg.t.Helper()
	r := tg.run(stdin, args...)
	if r.code != code {
		tg.t.Fatalf("fenced %s: exit %d, want %d (stderr %q)", strings.Join(args, " "), r.code, code, r.stderr)
	}
	if len(r.stdout) != 0 {
		tg.t.Errorf("fenced %s: stdout %q, want nothing", strings.Join(args, " "), r.stdout)
	}
	checkSentence(tg.t, r.stderr)
	return r.stderr
}

func checkSentence(t *testing.T, stderr string) {
	t.Helper()
	line, rest, _ := strings.Cut(stderr, "\n")
	if !strings.HasPrefix(line, "fenced: ") || !strings.HasSuffix(line, ".") || rest != "" {
		t.Errorf("stderr %q is not one sentence prefixed \"fenced: \"", stderr)
	}
	if op := repeatedOp(line); op != "" {
		t.Errorf("stderr %q names the operation %q twice in a row", stderr, op)
	}
}

// repeatedOp returns the operation that two layers of wrapping both name, one after the other
// ("bump epoch failed, nothing changed: bump epoch: ..."), or "".
func repeatedOp(line string) string {
	parts := strings.Split(line, ": ")
	for i := 1; i+1 < len(parts); i++ {
		op := strings.TrimSuffix(parts[i], " failed, nothing changed")
		if q := strings.IndexByte(op, '"'); q > 0 { // the quoted argument: acquire "R"
			op = strings.TrimSpace(op[:q])
		}
		next := parts[i+1]
		if len(op) >= 3 && strings.HasPrefix(next, op) && (len(next) == len(op) || strings.ContainsRune(" \"", rune(next[len(op)]))) {
			return op
		}
	}
	return ""
}

type leaseOut struct {
	Resource   string `json:"resource"`
	Owner      string `json:"owner"`
	Token      string `json:"token"`
	Epoch      int64  `json:"epoch"`
	Generation int64  `json:"generation"`
	LeaseUntil string `json:"lease_until"`
}

type stateOut struct {
	Resource            string  `json:"resource"`
	Epoch               int64   `json:"epoch"`
	Generation          int64   `json:"generation"`
	Owner               *string `json:"owner"`
	LeaseUntil          *string `json:"lease_until"`
	Held                bool    `json:"held"`
	PublishedEpoch      int64   `json:"published_epoch"`
	PublishedGeneration int64   `json:"published_generation"`
	PublishedAt         *string `json:"published_at"`
	SourceVersion       int64   `json:"source_version"`
	PayloadBytes        int64   `json:"payload_bytes"`
	CurrentEpoch        int64   `json:"current_epoch"`
	DatabaseNow         string  `json:"database_now"`
}

func decode[T any](t *testing.T, out []byte) T {
	t.Helper()
	var v T
	if bytes.Count(out, []byte("\n")) != 1 || !bytes.HasSuffix(out, []byte("\n")) {
		t.Fatalf("output %q is not one line", out)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	return v
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || v.Location() != time.UTC {
		t.Fatalf("time %q is not RFC 3339 in UTC: %v", s, err)
	}
	return v
}

func (tg target) acquire(resource, ttl string) leaseOut {
	tg.t.Helper()
	return decode[leaseOut](tg.t, tg.ok(nil, "acquire", resource, "--ttl", ttl))
}

func (tg target) show(resource string) stateOut {
	tg.t.Helper()
	return decode[stateOut](tg.t, tg.ok(nil, "show", resource))
}

// waitExpired waits until the database says resource's lease is no longer held.
func (tg target) waitExpired(resource string) {
	tg.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for tg.show(resource).Held {
		if time.Now().After(deadline) {
			tg.t.Fatalf("the lease on %s is still held after 30s", resource)
		}
		time.Sleep(20 * time.Millisecond) // polling the database's verdict, not hoping for an order
	}
}

func leaseArgs(op, resource string, l leaseOut, extra ...string) []string {
	return append([]string{op, resource, "--owner", l.Owner, "--generation", strconv.FormatInt(l.Generation, 10)}, extra...)
}

// forEachTarget runs body against a fresh SQLite file, when a server answers a fresh
// PostgreSQL schema, and a fenced serve (in this process) over a fresh SQLite file.
func forEachTarget(t *testing.T, body func(tg target)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		body(target{t: t, url: "sqlite:" + filepath.Join(dir, "test.db"), dir: dir})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		body(target{t: t, url: postgresSchema(t), dir: t.TempDir()})
	})
	t.Run("service", func(t *testing.T) {
		t.Parallel()
		body(serviceTarget(t))
	})
}

const defaultPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func pgPing(u string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// postgresSchema creates a schema of its own for t, dropped at the end, and returns a URL whose
// search_path selects it.
func postgresSchema(t *testing.T) string {
	base := drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", defaultPostgres, pgPing)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := "fenced_cli_test_" + strings.ToLower(rand.Text()[:16])
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		tg.ok(nil, "migrate")
		if out := string(tg.ok(nil, "provision", "report", "other")); out != `{"provisioned":["report","other"]}`+"\n" {
			t.Errorf("provision printed %q", out)
		}
		st := tg.show("report")
		if st.Generation != 0 || st.Owner != nil || st.LeaseUntil != nil || st.Held || st.PublishedGeneration != 0 ||
			st.PublishedAt != nil || st.PayloadBytes != 0 {
			t.Errorf("fresh resource: %+v", st)
		}
		parseTime(t, st.DatabaseNow)

		// Generation 1 publishes from stdin and releases.
		l1 := tg.acquire("report", "1m")
		if l1.Resource != "report" || l1.Generation != 1 || l1.Owner == "" {
			t.Errorf("acquire printed %+v", l1)
		}
		until := parseTime(t, l1.LeaseUntil)
		st = tg.show("report")
		if st.Generation != 1 || st.Owner == nil || *st.Owner != l1.Owner || !st.Held || *st.LeaseUntil != l1.LeaseUntil {
			t.Errorf("after acquire: %+v", st)
		}
		tg.ok([]byte("first report\n"), leaseArgs("publish", "report", l1)...)
		if got := string(tg.ok(nil, "get", "report")); got != "first report\n" {
			t.Errorf("get = %q", got)
		}
		renewed := decode[leaseOut](t, tg.ok(nil, leaseArgs("renew", "report", l1, "--ttl", "2m")...))
		if renewed.Generation != 1 || renewed.Owner != l1.Owner || !parseTime(t, renewed.LeaseUntil).After(until) {
			t.Errorf("renew printed %+v after %s", renewed, l1.LeaseUntil)
		}
		tg.ok(nil, leaseArgs("release", "report", l1)...)
		st = tg.show("report")
		if st.Owner != nil || st.LeaseUntil != nil || st.Held || st.PublishedGeneration != 1 || st.PublishedAt == nil ||
			st.PayloadBytes != int64(len("first report\n")) {
			t.Errorf("after release: %+v", st)
		}

		// Generation 2 publishes every byte value from a file.
		payload := make([]byte, 0, 512)
		for i := range 512 {
			payload = append(payload, byte(i))
		}
		file := filepath.Join(t.TempDir(), "payload.bin")
		if err := os.WriteFile(file, payload, 0o600); err != nil {
			t.Fatal(err)
		}
		l2 := tg.acquire("report", "1m")
		if l2.Generation != 2 || l2.Owner == l1.Owner {
			t.Errorf("second acquire printed %+v after %+v", l2, l1)
		}
		tg.ok([]byte("ignored"), leaseArgs("publish", "report", l2, "--file", file)...)
		if got := tg.ok(nil, "get", "report"); !bytes.Equal(got, payload) {
			t.Errorf("get returned %d bytes that differ from the %d published", len(got), len(payload))
		}
		tg.ok(nil, leaseArgs("release", "report", l2)...)

		// Provisioning again never resets a generation; the other resource is untouched.
		tg.ok(nil, "provision", "report")
		st = tg.show("report")
		if st.Generation != 2 || st.PublishedGeneration != 2 || st.PayloadBytes != int64(len(payload)) {
			t.Errorf("after provisioning again: %+v", st)
		}
		if st := tg.show("other"); st.Generation != 0 {
			t.Errorf("other resource: %+v", st)
		}

		// publish --release frees the lease in the same statement; an empty payload is a payload.
		l3 := tg.acquire("report", "1m")
		tg.ok(nil, leaseArgs("publish", "report", l3, "--release")...)
		if st := tg.show("report"); st.Owner != nil || st.PublishedGeneration != 3 || st.PayloadBytes != 0 {
			t.Errorf("after publish --release: %+v", st)
		}
		if got := tg.ok(nil, "get", "report"); len(got) != 0 {
			t.Errorf("get = %q, want the empty payload", got)
		}
	})
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		tg.ok(nil, "provision", "r", "empty")
		l := tg.acquire("r", "10m") // long enough for a loaded machine: the refusals below must not race its expiry

		// 2: usage and invalid input, before the database is touched.
		for _, args := range [][]string{
			{"acquire", "r", "--ttl", "abc"},
			{"acquire", "r", "--ttl", "0s"},
			{"acquire", "r", "--ttl", "-1s"},
			{"acquire", "r", "--ttl", "1ns"}, // below fenced.MinTTL
			{"acquire", "r"},                 // --ttl is required
			{"acquire", "--ttl", "1s"},       // no resource
			{"acquire", "r", "s", "--ttl", "1s"},
			{"show"},
			{"show", "r", "--bogus"},
			{"bogus"},
			{"provision"},
			{"provision", ""},
			{"renew", "r", "--owner", l.Owner, "--generation", "1", "--ttl", "0s"},
			{"renew", "r", "--owner", l.Owner, "--ttl", "1s"}, // no generation
			{"publish", "r", "--owner", l.Owner, "--generation", "x"},
			{"publish", "r", "--owner", l.Owner, "--generation", "0"},
			{"publish", "r", "--owner", "has\ttab", "--generation", "1"},
			{"release", "r", "--generation", "1"}, // no owner
			{"--db", "oracle://u@localhost/d", "show", "r"},
			{"--db", "fenced.db", "show", "r"},
		} {
			msg := tg.fails(2, nil, args...)
			if strings.Contains(msg, "@h") {
				t.Errorf("the error repeats the database URL: %q", msg)
			}
		}
		big := bytes.Repeat([]byte("x"), fenced.DefaultMaxPayloadBytes+1)
		tg.fails(2, big, leaseArgs("publish", "r", l)...)
		file := filepath.Join(t.TempDir(), "big")
		if err := os.WriteFile(file, big, 0o600); err != nil {
			t.Fatal(err)
		}
		tg.fails(2, nil, leaseArgs("publish", "r", l, "--file", file)...)
		if st := tg.show("r"); st.PublishedGeneration != 0 || st.PayloadBytes != 0 {
			t.Errorf("an oversize payload changed the row: %+v", st)
		}
		// Exactly the limit is accepted.
		tg.ok(big[1:], leaseArgs("publish", "r", l)...)

		// 3: busy.
		if msg := tg.fails(3, nil, "acquire", "r", "--ttl", "1s"); !strings.Contains(msg, "busy") {
			t.Errorf("busy: %q", msg)
		}

		// 4: not provisioned, nothing published.
		tg.fails(4, nil, "acquire", "nope", "--ttl", "1s")
		tg.fails(4, nil, "show", "nope")
		tg.fails(4, nil, "get", "nope")
		tg.fails(4, nil, "get", "empty")
		tg.fails(4, nil, leaseArgs("publish", "nope", l)...)

		// 5: a stale lease after another acquisition, and a second publication.
		tg.fails(5, []byte("again"), leaseArgs("publish", "r", l)...)
		tg.ok(nil, leaseArgs("release", "r", l)...)
		old := tg.acquire("r", "100ms")
		tg.waitExpired("r") // judged by the database's clock
		current := tg.acquire("r", "1m")
		if current.Generation != old.Generation+1 {
			t.Fatalf("acquired %+v after %+v", current, old)
		}
		if msg := tg.fails(5, []byte("stale"), leaseArgs("publish", "r", old)...); !strings.Contains(msg, "superseded") {
			t.Errorf("stale publish: %q", msg)
		}
		tg.fails(5, nil, leaseArgs("renew", "r", old, "--ttl", "1m")...)
		tg.fails(5, nil, leaseArgs("release", "r", old)...)
		if got := string(tg.ok(nil, "get", "r")); got != string(big[1:]) {
			t.Errorf("a refused operation changed the payload (%d bytes)", len(got))
		}
		if st := tg.show("r"); st.Generation != current.Generation || st.Owner == nil || *st.Owner != current.Owner || !st.Held {
			t.Errorf("a refused operation changed the lease: %+v", st)
		}
		// A lease that expired with nobody taking over cannot be renewed or used either.
		tg.ok(nil, leaseArgs("release", "r", current)...)
		short := tg.acquire("r", "100ms")
		tg.waitExpired("r")
		tg.fails(5, nil, leaseArgs("renew", "r", short, "--ttl", "1m")...)
		tg.fails(5, []byte("late"), leaseArgs("publish", "r", short)...)

		// 1: operational errors.
		tg.fails(1, nil, leaseArgs("publish", "r", short, "--file", filepath.Join(t.TempDir(), "missing"))...)
	})
}

func TestOperationalError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runIn(t, dir, "sqlite:"+filepath.Join(dir, "no", "such", "dir", "x.db"), nil, "show", "r")
	if r.code != 1 {
		t.Fatalf("unreachable database: exit %d, stderr %q", r.code, r.stderr)
	}
	checkSentence(t, r.stderr)
	r = runIn(t, dir, "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", nil, "show", "r")
	if r.code != 1 {
		t.Fatalf("unreachable server: exit %d, stderr %q", r.code, r.stderr)
	}
	checkSentence(t, r.stderr)
	// Nothing listens on port 1: the sentence names the host and the cause, once.
	for db, want := range map[string]string{
		"http://127.0.0.1:1":                       `fenced: epoch bump: cannot connect to the fenced service at 127.0.0.1:1: connection refused.`,
		"sqlserver://sa:pw@127.0.0.1:1?database=x": `fenced: epoch bump: cannot connect to the SQL Server at 127.0.0.1:1: connection refused.`,
	} {
		r = runIn(t, dir, db, nil, "epoch", "bump")
		if r.code != 1 || strings.TrimSpace(r.stderr) != want {
			t.Errorf("%s unreachable: exit %d, stderr %q; want 1 and %q", db, r.code, r.stderr, want)
		}
	}
}

func TestDatabaseSelection(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}
	// Default: fenced.db in the working directory.
	if r := runIn(t, dir, "", nil, "provision", "a"); r.code != 0 {
		t.Fatalf("provision: exit %d, %q", r.code, r.stderr)
	}
	if !exists("fenced.db") {
		t.Fatal("no fenced.db in the working directory")
	}
	// FENCED_DB selects another file.
	env := "sqlite:" + filepath.Join(dir, "env.db")
	if r := runIn(t, dir, env, nil, "provision", "b"); r.code != 0 {
		t.Fatalf("provision: exit %d, %q", r.code, r.stderr)
	}
	if r := runIn(t, dir, env, nil, "show", "a"); r.code != 4 {
		t.Errorf("FENCED_DB was not used: show a exited %d", r.code)
	}
	// --db wins over FENCED_DB.
	if r := runIn(t, dir, env, nil, "--db", "sqlite:fenced.db", "show", "a"); r.code != 0 {
		t.Errorf("--db was not used: show a exited %d, %q", r.code, r.stderr)
	}
	if r := runIn(t, dir, "", nil, "show", "b"); r.code != 4 {
		t.Errorf("default database: show b exited %d", r.code)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runIn(t, dir, "", nil, "help")
	if r.code != 0 {
		t.Fatalf("help: exit %d", r.code)
	}
	for _, c := range []string{"migrate", "provision", "acquire", "renew", "publish", "release", "show", "get", "demo", "Exit codes"} {
		if !strings.Contains(string(r.stdout), c) {
			t.Errorf("help does not mention %s", c)
		}
	}
	if strings.Contains(string(r.stdout), "demo-worker") {
		t.Error("help lists the hidden demo-worker")
	}
	for _, c := range []string{"migrate", "provision", "acquire", "renew", "publish", "release", "show", "get", "demo"} {
		r := runIn(t, dir, "", nil, c, "--help")
		if r.code != 0 || !strings.Contains(string(r.stdout), "Exit codes") {
			t.Errorf("%s --help: exit %d, output %q", c, r.code, r.stdout)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "fenced.db")); err == nil {
		t.Error("help created a database")
	}
}

// A mistyped subcommand of a command that only groups others ("fenced epoch bumb" after a
// restore) is a usage error, not its help with exit 0 that a script would take for a bump;
// every positional-argument error names what is missing. Nothing touches the database.
func TestArgumentErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"epoch", "bumb"}, `unknown command "bumb" for "fenced epoch"`},
		{[]string{"epoch"}, `"fenced epoch bump"`},
		{[]string{"resolve"}, "resolve takes exactly one OP_ID argument, got 0"},
		{[]string{"resolve", "a", "b"}, "resolve takes exactly one OP_ID argument, got 2"},
		{[]string{"serve-token", "--role", "worker", "--prefix", "*"}, "serve-token takes exactly one NAME argument, got 0"},
		// A duration flag's bad value reads as --ttl's, not as time.ParseDuration's message.
		{[]string{"acquire", "r", "--ttl", "5s", "--wait", "x"}, `fenced: invalid --wait "x": use a duration such as 30s, 5m or 1h; see "fenced acquire --help".`},
		{[]string{"prune", "--older-than", "400d"}, `fenced: invalid --older-than "400d": use a duration such as`},
	} {
		r := runIn(t, dir, "", nil, tc.args...)
		if r.code != 2 || len(r.stdout) != 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fenced %s: exit %d, stdout %d bytes, stderr %q; want exit 2 and %q",
				strings.Join(tc.args, " "), r.code, len(r.stdout), r.stderr, tc.want)
			continue
		}
		checkSentence(t, r.stderr)
	}
	if r := runIn(t, dir, "", nil, "epoch", "--help"); r.code != 0 || !strings.HasPrefix(string(r.stdout), "Recovery epochs:") {
		t.Errorf("epoch --help: exit %d, output starts %.40q; want its description first", r.code, r.stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "fenced.db")); err == nil {
		t.Error("an argument error created a database")
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	start := time.Now()
	r := runIn(t, t.TempDir(), "", nil, "demo")
	out := string(r.stdout)
	t.Logf("fenced demo took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	if r.code != 0 {
		t.Fatalf("demo: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`A +acquired generation 1 `),
		regexp.MustCompile(`demo +SIGSTOP A`),
		regexp.MustCompile(`demo +the database says A's lease expired at`),
		regexp.MustCompile(`B +acquired generation 2 `),
		regexp.MustCompile(`B +published "report by B" with generation 2: ACCEPTED`),
		regexp.MustCompile(`A +published "report by A" with generation 1: REFUSED by the database \(generation 1 was superseded by generation 2\)`),
		regexp.MustCompile(`A +exited with code 5`),
		regexp.MustCompile(`final payload "report by B" \(published generation 2\): B's result was kept`),
		regexp.MustCompile(`A +wrote \(unconditionally\) "report by A" with generation 1: ACCEPTED`),
		regexp.MustCompile(`final payload "report by A" \(published generation 1\): B's result was LOST`),
		regexp.MustCompile(`A +uploaded its report, 11 bytes, as the artifact fenced-artifacts/nightly-report/\d+\.1/`),
		regexp.MustCompile(`A +published the pointer to its artifact "report by A" with generation 1: REFUSED by the database \(generation 1 was superseded by generation 2\)`),
		regexp.MustCompile(`get follows the pointer of generation 2 to \S+: "report by B", size and SHA-256 verified: B's artifact was kept`),
		regexp.MustCompile(`gc deleted the orphan of generation 1, fenced-artifacts/nightly-report/\d+\.1/\S+ \(11 bytes\)`),
		regexp.MustCompile(`(?m)^Result: `),
	} {
		if !want.MatchString(out) {
			t.Errorf("the timeline has no line matching %s", want)
		}
	}
	// The temporary directory is gone and no worker outlived the demo. Other tests run demos
	// at the same time: a worker is this demo's when its --db is in this demo's directory.
	m := regexp.MustCompile(`SQLite in (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("the demo did not say where its database was")
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the demo left %s behind (%v)", m[1], err)
	}
	if procs, err := filepath.Glob("/proc/[0-9]*/cmdline"); err == nil {
		for _, p := range procs {
			cmdline, err := os.ReadFile(p)
			if err == nil && bytes.HasPrefix(cmdline, []byte(bin+"\x00demo-worker")) && bytes.Contains(cmdline, []byte("\x00sqlite:"+m[1]+"/")) {
				t.Errorf("a demo worker outlived the demo: %s", p)
			}
		}
	}
}
