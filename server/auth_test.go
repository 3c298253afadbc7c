package server_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

type secrets struct{ readerA, workerA, workerAll, admin string }

// authService runs a service with four tokens: a reader and a worker limited to "team a/",
// a worker on every resource, and an admin.
func authService(t *testing.T) (*harness, *fenced.Store, secrets) {
	t.Helper()
	var s secrets
	var lines []string
	for _, tk := range []struct {
		secret   *string
		name     string
		role     server.Role
		prefixes []string
	}{
		{&s.readerA, "reader-a", server.RoleReader, []string{"team a/"}},
		{&s.workerA, "worker-a", server.RoleWorker, []string{"team a/", "shared-"}},
		{&s.workerAll, "worker-all", server.RoleWorker, []string{"*"}},
		{&s.admin, "admin", server.RoleAdmin, []string{"*"}},
	} {
		secret, line, err := server.NewSecret(tk.name, tk.role, tk.prefixes...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, secret) {
			t.Fatal("the tokens line holds the secret itself")
		}
		*tk.secret = secret
		lines = append(lines, line)
	}
	tokens, err := server.ParseTokens(strings.NewReader("# tokens\n\n" + strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	h, store := sqliteService(t, &server.Options{Tokens: tokens})
	if _, err := store.BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := store.Provision(testCtx(t), "team a/x", "team b/x", "shared-ü"); err != nil {
		t.Fatal(err)
	}
	return h, store, s
}

// TestRoleBoundaries tries every operation with every role, on a resource inside and outside
// the token's prefixes, through real requests.
func TestRoleBoundaries(t *testing.T) {
	h, store, s := authService(t)
	type op struct {
		name     string
		need     server.Role
		resource string // "" for operations on no resource
		send     func(bearer string) answer
	}
	lease, err := store.Acquire(testCtx(t), "team a/x", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaseBody := mustJSON(t, map[string]any{"owner": lease.Owner(), "token": "1.1", "ttl_ms": 1000})
	onResource := func(method, suffix string, body []byte) func(resource string) func(string) answer {
		return func(resource string) func(string) answer {
			return func(bearer string) answer {
				return call(t, h, bearer, method, "/v1/resources/"+url.PathEscape(resource)+suffix, nil, body)
			}
		}
	}
	resourceOps := []struct {
		name string
		need server.Role
		send func(resource string) func(string) answer
	}{
		{"show", server.RoleReader, onResource("GET", "", nil)},
		{"get", server.RoleReader, onResource("GET", "/payload", nil)},
		{"provision", server.RoleWorker, onResource("PUT", "", nil)},
		{"acquire", server.RoleWorker, onResource("POST", "/acquire", mustJSON(t, map[string]any{"ttl_ms": 1000}))},
		{"renew", server.RoleWorker, onResource("POST", "/renew", leaseBody)},
		{"publish", server.RoleWorker, onResource("POST", "/publish", nil)},
		{"publish-and-release", server.RoleWorker, onResource("POST", "/publish-and-release", nil)},
		{"release", server.RoleWorker, onResource("POST", "/release", mustJSON(t, map[string]any{"owner": "o", "token": "1.1"}))},
	}
	var ops []op
	ids := 0
	for _, o := range resourceOps {
		for _, r := range []string{"team a/x", "team b/x"} {
			ops = append(ops, op{o.name + " " + r, o.need, r, o.send(r)})
		}
	}
	ops = append(ops,
		op{"read operation", server.RoleReader, "", func(b string) answer { return call(t, h, b, "GET", "/v1/operations/some-id", nil, nil) }},
		op{"resolve", server.RoleWorker, "", func(b string) answer {
			ids++
			return call(t, h, b, "POST", "/v1/operations/id-"+strconv.Itoa(ids)+"/resolve", nil, nil)
		}},
		op{"info", server.RoleReader, "", func(b string) answer { return call(t, h, b, "GET", "/v1/info", nil, nil) }},
		op{"metrics", server.RoleReader, "", func(b string) answer { return call(t, h, b, "GET", "/metrics", nil, nil) }},
		op{"prune", server.RoleAdmin, "", func(b string) answer {
			return call(t, h, b, "POST", "/v1/operations/prune", nil, mustJSON(t, map[string]any{"age_ms": store.MinPruneAge().Milliseconds()}))
		}},
	)
	roles := []struct {
		name   string
		role   server.Role
		secret string
		covers func(resource string) bool
	}{
		{"reader-a", server.RoleReader, s.readerA, func(r string) bool { return strings.HasPrefix(r, "team a/") }},
		{"worker-a", server.RoleWorker, s.workerA, func(r string) bool { return strings.HasPrefix(r, "team a/") }},
		{"worker-all", server.RoleWorker, s.workerAll, func(string) bool { return true }},
		{"admin", server.RoleAdmin, s.admin, func(string) bool { return true }},
	}
	for _, o := range ops {
		for _, r := range roles {
			allowed := r.role >= o.need && (o.resource == "" || r.covers(o.resource))
			a := o.send(r.secret)
			if allowed && (a.status == 401 || a.status == 403) {
				t.Errorf("%s as %s: %d %s, want it allowed", o.name, r.name, a.status, a.body)
			}
			if !allowed {
				if a.status != 403 {
					t.Errorf("%s as %s: %d %s, want 403", o.name, r.name, a.status, a.body)
				} else if p := a.problem(t); p.Type != server.TypeForbidden || p.Applied == nil || *p.Applied {
					t.Errorf("%s as %s: problem %+v", o.name, r.name, p)
				}
			}
		}
		for what, bearer := range map[string]string{"no token": "", "an unknown token": "fenced_0000"} {
			a := o.send(bearer)
			if a.status != 401 || a.header.Get("WWW-Authenticate") == "" || a.problem(t).Type != server.TypeUnauthenticated {
				t.Errorf("%s with %s: %d %v %s, want 401 with WWW-Authenticate", o.name, what, a.status, a.header, a.body)
			}
		}
	}
	// The epoch bump last: it frees every lease. A worker for every resource still may not.
	for _, secret := range []string{s.readerA, s.workerA, s.workerAll} {
		if a := call(t, h, secret, "POST", "/v1/epoch/bump", nil, nil); a.status != 403 {
			t.Errorf("bump as a non-admin: %d %s", a.status, a.body)
		}
	}
	if a := call(t, h, s.admin, "POST", "/v1/epoch/bump", nil, nil); a.status != 200 {
		t.Errorf("bump as admin: %d %s", a.status, a.body)
	}
}

// TestPrefixesThroughTheDriver: a worker limited to prefixes works through fenced.Store over
// the remote driver on its own resources, after an epoch bump, and is refused elsewhere as
// certainly not applied; an accepted operation of another team's resource is not shown.
func TestPrefixesThroughTheDriver(t *testing.T) {
	h, _, s := authService(t)
	worker := remoteStore(t, h, s.workerA)
	other := remoteStore(t, h, s.workerAll)
	if _, err := remoteStore(t, h, s.admin).BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	l, err := worker.Acquire(testCtx(t), "shared-ü", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.PublishAndRelease(testCtx(t), []byte("ok\x00"), fenced.WithOpID("mine")); err != nil {
		t.Fatal(err)
	}
	if r, err := worker.Resolve(testCtx(t), "mine"); err != nil || !r.Accepted {
		t.Fatalf("resolve own operation: %+v, %v", r, err)
	}
	_, err = worker.Acquire(testCtx(t), "team b/x", time.Minute)
	if err == nil || !errors.Is(err, driver.ErrNotApplied) || errors.Is(err, fenced.ErrOutcomeUnknown) || errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("acquire outside the prefixes: %v, want a certain failure", err)
	}
	if _, err := worker.Show(testCtx(t), "team b/x"); err == nil {
		t.Fatal("show outside the prefixes succeeded")
	}
	lb, err := other.Acquire(testCtx(t), "team b/x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.Publish(testCtx(t), []byte("b"), fenced.WithOpID("theirs")); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Resolve(testCtx(t), "theirs"); err == nil {
		t.Fatal("a worker of team a read the outcome of team b's operation")
	}
}

// TestNoTokensAnswersLoopbackOnly: without a tokens file, only loopback peers are answered.
func TestNoTokensAnswersLoopbackOnly(t *testing.T) {
	srv, err := server.New(newStore(t, sqliteBacking(t).open(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]int{"127.0.0.1:5000": 200, "[::1]:5000": 200, "192.0.2.7:5000": 403, "[2001:db8::1]:80": 403, "10.0.0.1:1": 403} {
		req := httptest.NewRequest("GET", "/v1/info", nil)
		req.RemoteAddr, req.Host = addr, "localhost"
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("from %s: %d, want %d", addr, rec.Code, want)
		}
		if want == 403 {
			var p server.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Type != server.TypeForbidden {
				t.Errorf("from %s: %s", addr, rec.Body)
			}
		}
	}
	_ = http.StatusOK
}

func TestParseTokensRejects(t *testing.T) {
	hash := "sha256:" + strings.Repeat("ab", 32)
	for name, text := range map[string]string{
		"empty":                  "# nobody\n",
		"too few fields":         "a worker " + hash,
		"unknown role":           "a owner " + hash + " x/",
		"short hash":             "a worker sha256:abcd x/",
		"hash without algorithm": "a worker " + strings.Repeat("ab", 32) + " x/",
		"admin with a prefix":    "a admin " + hash + " x/",
		"star and prefixes":      "a worker " + hash + " * x/",
		"duplicate name":         "a worker " + hash + " x/\na reader sha256:" + strings.Repeat("cd", 32) + " x/",
		"duplicate hash":         "a worker " + hash + " x/\nb reader " + hash + " x/",
	} {
		if _, err := server.ParseTokens(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
