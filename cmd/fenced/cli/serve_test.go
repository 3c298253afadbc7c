package cli_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/cmd/fenced/cli"
	"github.com/fenced-dev/fenced/server"
)

// service is a "fenced serve" running in this process.
type service struct {
	url    string
	stop   context.CancelFunc
	done   chan int
	stderr *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startService runs fenced serve with args until the test ends, and returns once it listens.
func startService(t *testing.T, args ...string) *service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	s := &service{stop: cancel, done: make(chan int, 1), stderr: &lockedBuffer{}}
	go func() {
		code := cli.Main(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), strings.NewReader(""), pw, s.stderr)
		_ = pw.Close()
		s.done <- code
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err != nil {
		cancel()
		t.Fatalf("fenced serve did not start: exit %d, stderr %q", <-s.done, s.stderr.String())
	}
	var out struct{ Listening string }
	if err := json.Unmarshal([]byte(line), &out); err != nil || out.Listening == "" {
		t.Fatalf("fenced serve printed %q", line)
	}
	s.url = out.Listening
	t.Cleanup(func() {
		cancel()
		if code := <-s.done; code != 0 {
			t.Errorf("fenced serve exited %d: %s", code, s.stderr.String())
		}
	})
	return s
}

// serviceTarget is a target whose commands go through a fenced serve over a new SQLite file.
func serviceTarget(t *testing.T) target {
	dir := t.TempDir()
	s := startService(t, "--db", "sqlite:"+filepath.Join(dir, "service.db"))
	return target{t: t, url: s.url, dir: dir}
}

func TestServeRefusesUnsafeListening(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "x.db")
	tg := target{t: t, url: db, dir: dir}
	for _, args := range [][]string{
		{"serve", "--listen", "0.0.0.0:0"},
		{"serve", "--listen", "[::]:0"},
		{"serve", "--listen", "192.0.2.1:7070"},
		{"serve", "--listen", "nonsense"},
		{"serve", "--tls-cert", "c.pem"},
		{"serve", "--tokens", filepath.Join(dir, "missing")},
		{"serve", "--db", "http://127.0.0.1:1"},
		{"serve", "--max-wait", "0s"},
		{"serve-token", "n", "--role", "owner", "--prefix", "x"},
		{"serve-token", "n", "--role", "admin", "--prefix", "x/"},
		{"serve-token", "n", "--role", "worker"},
	} {
		tg.fails(cli.ExitUsage, nil, args...)
	}
}

// TestServeMaxWait: --max-wait is the service's limit on one wait, as /v1/info reports it and
// as a waiting acquisition finds it.
func TestServeMaxWait(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startService(t, "--db", "sqlite:"+filepath.Join(dir, "service.db"), "--max-wait", "2h")
	resp, err := http.Get(s.url + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info server.Info
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || time.Duration(info.MaxWait)*time.Millisecond != 2*time.Hour {
		t.Fatalf("/v1/info with --max-wait 2h: max_wait_ms %v, %v", info.MaxWait, err)
	}
	tg := target{t: t, url: s.url, dir: dir}
	tg.ok(nil, "provision", "r")
	// Longer than the default limit, so invalid (400) without the flag; free, so granted at once.
	a, err := http.Post(s.url+"/v1/resources/r/acquire", "application/json", strings.NewReader(`{"ttl_ms":60000,"wait_ms":3600000}`))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Body.Close()
	if a.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(a.Body)
		t.Fatalf("a wait of 1h with --max-wait 2h: %d %s", a.StatusCode, b)
	}
}

// TestServeGracefulShutdown: a request in flight when the shutdown begins still gets its
// answer, and the service then exits 0. The schedule is forced with the service's hooks.
func TestServeGracefulShutdown(t *testing.T) {
	active := make(chan struct{}, 16)
	shutting := make(chan struct{})
	// Restored after the service's own cleanup has stopped it (cleanups run last-in first-out).
	t.Cleanup(cli.SetServeHooks(func() { active <- struct{}{} }, func() { close(shutting) }))
	dir := t.TempDir()
	s := startService(t, "--db", "sqlite:"+filepath.Join(dir, "s.db"))
	store, err := fenced.New(context.Background(), mustRemote(t, s.url, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Provision(context.Background(), "r ü"); err != nil {
		t.Fatal(err)
	}
	l, err := store.Acquire(context.Background(), "r ü", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_ = store.Close() // its idle connection would otherwise count as a second active one
	for len(active) > 0 {
		<-active
	}
	// A publication whose body is still arriving when the shutdown begins.
	body, feed := io.Pipe()
	req, err := http.NewRequest("POST", s.url+"/v1/resources/r%20%C3%BC/publish", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Fenced-Owner", l.Owner())
	req.Header.Set("Fenced-Token", l.Token().String())
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Errorf("the request in flight failed: %v", err)
		}
		answered <- resp
	}()
	if _, err := feed.Write([]byte("first half \x00")); err != nil {
		t.Fatal(err)
	}
	<-active // the service is reading the request
	s.stop()
	<-shutting
	if _, err := feed.Write([]byte("second half")); err != nil {
		t.Fatal(err)
	}
	_ = feed.Close()
	resp := <-answered
	if resp == nil {
		t.FailNow()
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the request in flight got %d %s", resp.StatusCode, b)
	}
	tr.CloseIdleConnections()
	direct, err := fenced.New(context.Background(), sqliteDriver(t, filepath.Join(dir, "s.db")), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if got, _, err := direct.Get(context.Background(), "r ü"); err != nil || string(got) != "first half \x00second half" {
		t.Fatalf("published %q, %v", got, err)
	}
}

// TestServeTLSAndTokens: a service beyond loopback with TLS and a tokens file made by
// serve-token; the CLI reaches it with $FENCED_API_TOKEN and the system's trust (SSL_CERT_FILE).
func TestServeTLSAndTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	tg := target{t: t, url: "sqlite:" + filepath.Join(dir, "t.db"), dir: dir}
	var tok struct{ Secret, Line string }
	if err := json.Unmarshal(tg.ok(nil, "serve-token", "ci", "--role", "worker", "--prefix", "builds/"), &tok); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(tok.Line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startService(t, "--db", tg.url, "--tokens", tokens, "--tls-cert", certFile, "--tls-key", keyFile, "--log-requests")
	if !strings.HasPrefix(s.url, "https://") {
		t.Fatalf("service URL %s", s.url)
	}
	store, err := fenced.New(context.Background(), mustRemote(t, s.url, &remote.Options{BearerToken: tok.Secret, TLS: &tls.Config{RootCAs: pool}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Provision(context.Background(), "builds/ü 1"); err != nil {
		t.Fatal(err)
	}
	if err := store.Provision(context.Background(), "other"); err == nil {
		t.Fatal("a worker for builds/ provisioned other")
	}
	for _, want := range []string{"operation=provision", "status=204", "outcome=urn:fenced:problem:forbidden", "request_id="} {
		if !strings.Contains(s.stderr.String(), want) {
			t.Errorf("the request log lacks %q:\n%s", want, s.stderr.String())
		}
	}
	noToken, err := fenced.New(context.Background(), mustRemote(t, s.url, &remote.Options{TLS: &tls.Config{RootCAs: pool}}), &fenced.Config{SkipMigrate: true})
	if err == nil {
		defer noToken.Close()
		if _, err := noToken.Show(context.Background(), "builds/ü 1"); err == nil {
			t.Fatal("show without a token succeeded")
		}
	}

	// The command: a token the service does not know (401) is exit 1; one it refuses the
	// operation to (403: outside its prefixes or its role) is permission denied, exit 8, as a
	// database's refusal to its role is; one sentence naming the reason, as the exit-code
	// table says.
	cli := target{t: t, url: s.url, dir: dir}
	env := []string{"SSL_CERT_FILE=" + certFile, "FENCED_API_TOKEN=" + tok.Secret}
	if r := runEnv(t, cli, env, "acquire", "builds/ü 1", "--ttl", "30s"); r.code != 0 {
		t.Fatalf("acquire with the worker's token: exit %d: %s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{env, []string{"acquire", "other", "--ttl", "30s"}, 8, `acquire "other" failed, nothing changed: the service answered 403: token "ci" may not act on resource "other"`},
		{env, []string{"show", "other"}, 8, "outside its prefixes"},
		{env, []string{"epoch", "bump"}, 8, "bump epoch failed, nothing changed: the service answered 403: token \"ci\" has role worker; this operation needs admin."},
		{env, []string{"prune", "--older-than", "9000h"}, 8, "prune operations: the service answered 403: token \"ci\" has role worker; this operation needs admin."},
		{[]string{"SSL_CERT_FILE=" + certFile, "FENCED_API_TOKEN=fenced_not-a-token"}, []string{"show", "builds/ü 1"}, 1, "not in the tokens file"},
	} {
		r := runEnv(t, cli, tc.env, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fenced %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.code, tc.want)
			continue
		}
		checkSentence(t, r.stderr)
	}
}

func sqliteDriver(t *testing.T, path string) *sqlite.Driver {
	t.Helper()
	d, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustRemote(t *testing.T, url string, opts *remote.Options) *remote.Driver {
	t.Helper()
	d, err := remote.Open(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns a pool trusting it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fenced test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTortureThroughService: fenced torture's workers reach their database only through a
// fenced serve over SQLite; with pauses, kill -9 and dropped replies (between worker and
// service) the checker finds no violation. (The clock and row-lock faults act on the
// database itself and are not implemented through a service.)
func TestTortureThroughService(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startService(t, "--db", "sqlite:"+filepath.Join(dir, "torture.db"))
	code, out := runTorture(t, s.url, "--faults", "pause,kill,drop-reply")
	if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
		t.Fatalf("fenced torture through the service: exit %d, want 0 and no violations", code)
	}
	checkTortured(t, out, "pause", "kill", "drop-reply")
}

// TestServeSyncConnections: by default (--sync-connections) a client on the remote driver's
// SyncTransport has its connection served by the loop after its first request, so the
// http.Server sees that connection become active once; with --sync-connections=false it sees
// every request (the control). The cycle runs after an epoch bump, on a name with a space and a non-ASCII
// letter and a payload with a NUL byte.
func TestServeSyncConnections(t *testing.T) {
	for _, tc := range []struct {
		name     string
		flags    []string
		oneStart bool
	}{{"by default", nil, true}, {"with the flag", []string{"--sync-connections"}, true}, {"turned off", []string{"--sync-connections=false"}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var active atomic.Int64
			t.Cleanup(cli.SetServeHooks(func() { active.Add(1) }, func() {}))
			s := startService(t, append([]string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "s.db")}, tc.flags...)...)
			store, err := fenced.New(context.Background(), mustRemote(t, s.url, &remote.Options{SyncTransport: true}), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			ctx := context.Background()
			if _, err := store.BumpEpoch(ctx); err != nil {
				t.Fatal(err)
			}
			if err := store.Provision(ctx, "r ü"); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				l, err := store.Acquire(ctx, "r ü", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if l.Token().Epoch == l.Token().Generation {
					t.Fatalf("token %s: the epoch bump did not take", l.Token())
				}
				if err := l.PublishAndRelease(ctx, []byte("a\x00b")); err != nil {
					t.Fatal(err)
				}
			}
			if got, _, err := store.Get(ctx, "r ü"); err != nil || string(got) != "a\x00b" {
				t.Fatalf("published %q, %v", got, err)
			}
			if n := active.Load(); (n == 1) != tc.oneStart {
				t.Errorf("the http.Server saw a connection become active %d times", n)
			}
			// The service's own metrics count every request, on the loop too.
			resp, err := http.Get(s.url + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			m, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`fenced_answers_total{operation="acquire",outcome="ok"} 3`, `fenced_answers_total{operation="publish-and-release",outcome="ok"} 3`} {
				if !strings.Contains(string(m), want+"\n") {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}

// TestServiceClientTransport: the --db http:// client uses the remote driver's SyncTransport
// (its first request on a connection asks for the service's loop) unless the URL says
// transport=standard, or a proxy from the environment applies to the URL: then it goes
// through the proxy on net/http's transport. transport=sync bypasses the proxy.
func TestServiceClientTransport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d, err := sqlite.Open(filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := fenced.New(context.Background(), d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv, err := server.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // each request's Host and Fenced-Connection header
	h := srv.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host+" "+r.Header.Get(server.HeaderSyncConnection))
		mu.Unlock()
		// Playing the proxy too, it hands the request on to the service addressed on loopback,
		// the only names a service without tokens answers to.
		r.Host = r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	took := func() []string {
		mu.Lock()
		defer mu.Unlock()
		s := seen
		seen = nil
		return s
	}
	direct := strings.TrimPrefix(ts.URL, "http://") + " "
	// A proxy that applies: the test's server plays it, and answers as the service.
	const far = "http://fenced-service.invalid:7070"
	proxied := []string{"HTTP_PROXY=" + ts.URL, "http_proxy=" + ts.URL, "NO_PROXY=", "no_proxy="}
	run := func(db string, env []string, args ...string) result {
		t.Helper()
		return runEnv(t, target{t: t, url: db, dir: dir}, env, args...)
	}
	for _, tc := range []struct {
		name, db string
		env      []string
		first    string // what the service saw of the first request
	}{
		{"default", ts.URL, nil, direct + "sync"},
		{"transport=standard", ts.URL + "/?transport=standard", nil, direct},
		{"a proxy applies", far, proxied, "fenced-service.invalid:7070 "},
		{"a proxy that does not apply", ts.URL, proxied, direct + "sync"}, // loopback is never proxied
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := run(tc.db, tc.env, "epoch", "bump"); r.code != 0 {
				t.Fatalf("epoch bump: exit %d, %s", r.code, r.stderr)
			}
			if r := run(tc.db, tc.env, "provision", "r ü"); r.code != 0 {
				t.Fatalf("provision: exit %d, %s", r.code, r.stderr)
			}
			if got := took(); len(got) == 0 || got[0] != tc.first {
				t.Fatalf("the service saw %q, want first %q", got, tc.first)
			}
		})
	}
	// transport=sync past a proxy dials the service itself, here a name that does not resolve.
	if r := run(far+"?transport=sync", proxied, "show", "r ü"); r.code != cli.ExitOperational {
		t.Errorf("transport=sync past a proxy: exit %d (%s), want %d", r.code, r.stderr, cli.ExitOperational)
	}
	if got := took(); len(got) != 0 {
		t.Errorf("transport=sync went through the proxy: %q", got)
	}
	for _, q := range []string{"?transport=h2", "?transport=sync&x=1", "?x=1"} {
		r := run(ts.URL+q, nil, "show", "r ü")
		if r.code != cli.ExitUsage || len(r.stdout) != 0 {
			t.Errorf("--db %s: exit %d, stdout %q; want %d and nothing", q, r.code, r.stdout, cli.ExitUsage)
		}
		checkSentence(t, r.stderr)
	}
	if got := took(); len(got) != 0 {
		t.Errorf("a refused URL sent requests: %q", got)
	}
}
