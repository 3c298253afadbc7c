package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// names that a path could mangle: slashes, dots, spaces, non-ASCII, percent signs.
var awkwardNames = []string{"report für Q3", "a/b", "a//b/", ".", "..", "100%", "x?y#z"}

// answer is one HTTP exchange's result.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) problem(t *testing.T) server.Problem {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with Content-Type %q, want application/problem+json: %s", a.status, ct, a.body)
	}
	var p server.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != a.status {
		t.Fatalf("problem status %d in a %d answer", p.Status, a.status)
	}
	return p
}

// call sends one request to the service; a "Host" in header replaces the request's Host.
func call(t *testing.T, h *harness, bearer, method, path string, header map[string]string, body []byte) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), method, h.url()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil && header["Content-Type"] == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if host := header["Host"]; host != "" {
		req.Host = host
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sqliteService(t *testing.T, opts *server.Options) (*harness, *fenced.Store) {
	store := newStore(t, sqliteBacking(t).open(t))
	return startServer(t, store, opts), store
}

// remoteStore is a fenced store whose driver speaks to h.
func remoteStore(t testing.TB, h *harness, bearer string) *fenced.Store {
	t.Helper()
	s, err := fenced.New(testCtx(t), client(t, h.addr, bearer), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOpenAPIDocument(t *testing.T) {
	d := openAPI(t)
	if !d.IsOpenAPI31OrLater() || d.OpenAPI != "3.1.0" {
		t.Fatalf("the document is OpenAPI %s, want 3.1.0", d.OpenAPI)
	}
	h, _ := sqliteService(t, nil)
	a := call(t, h, "", "GET", "/openapi.json", nil, nil)
	if a.status != 200 || !bytes.Equal(a.body, server.OpenAPI) {
		t.Fatalf("GET /openapi.json: %d, %d bytes; want the embedded document", a.status, len(a.body))
	}
}

// TestValidatorCatchesMismatches shows that the validation every test runs can fail: answers
// that break the document are rejected.
func TestValidatorCatchesMismatches(t *testing.T) {
	d := openAPI(t)
	path := "/v1/resources/{name}"
	item := d.Paths.Value(path)
	for name, c := range map[string]struct {
		status int
		ct     string
		body   string
	}{
		"state without the clock":      {200, "application/json", `{"resource":"r","token":"1.1","epoch":1,"generation":1,"held":false,"published_epoch":0,"published_generation":0,"source_version":0,"payload_size":0,"current_epoch":1}`},
		"token as a number":            {200, "application/json", `{"resource":"r","token":1.1,"epoch":1,"generation":1,"held":false,"published_epoch":0,"published_generation":0,"source_version":0,"payload_size":0,"current_epoch":1,"now":"2026-01-01T00:00:00Z"}`},
		"an undocumented status":       {418, "application/problem+json", `{"type":"urn:fenced:problem:busy","title":"t","status":418}`},
		"a problem of an unknown type": {404, "application/problem+json", `{"type":"about:blank","title":"t","status":404}`},
		"a problem as plain JSON":      {404, "application/json", `{"type":"urn:fenced:problem:not-provisioned","title":"t","status":404}`},
	} {
		req := httptest.NewRequest("GET", "/v1/resources/r", nil)
		opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: map[string]string{"name": "r"}, Options: opts,
			Route: &routers.Route{Spec: d, Path: path, PathItem: item, Method: "GET", Operation: item.Get}}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: c.status,
			Header: http.Header{"Content-Type": {c.ct}}, Options: opts}
		out.SetBodyBytes([]byte(c.body))
		if err := openapi3filter.ValidateResponse(context.Background(), out); err == nil {
			t.Errorf("%s: the validator accepted it", name)
		}
	}
}

// TestStatusPerOutcome drives each outcome class through real requests and checks its status
// and problem type; the harness checks every answer against the document as well.
func TestStatusPerOutcome(t *testing.T) {
	h, store := sqliteService(t, nil)
	if err := store.Provision(testCtx(t), "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(testCtx(t)); err != nil { // epoch != generation from here on
		t.Fatal(err)
	}
	acq := func(name string) answer {
		return call(t, h, "", "POST", "/v1/resources/"+name+"/acquire", nil, mustJSON(t, map[string]any{"ttl_ms": 60000}))
	}
	a := acq("r")
	if a.status != 200 {
		t.Fatalf("acquire: %d %s", a.status, a.body)
	}
	var l server.Lease
	if err := json.Unmarshal(a.body, &l); err != nil {
		t.Fatal(err)
	}
	if l.Epoch < 1e15 || l.Token != (fenced.Token{Epoch: l.Epoch, Generation: l.Generation}).String() || l.Owner == "" {
		t.Fatalf("lease %+v: want a clock epoch and a matching token string", l)
	}
	pub := func(owner, token string, body []byte) answer {
		return call(t, h, "", "POST", "/v1/resources/r/publish",
			map[string]string{"Content-Type": "application/octet-stream", server.HeaderOwner: owner, server.HeaderToken: token}, body)
	}
	want := func(what string, a answer, status int, typ string) server.Problem {
		t.Helper()
		if a.status != status {
			t.Fatalf("%s: %d %s, want %d", what, a.status, a.body, status)
		}
		p := a.problem(t)
		if p.Type != typ {
			t.Fatalf("%s: type %s, want %s", what, p.Type, typ)
		}
		return p
	}
	want("get before any publication", call(t, h, "", "GET", "/v1/resources/r/payload", nil, nil), 404, server.TypeNothingPublished)
	if a := pub(l.Owner, l.Token, []byte("v1\x00")); a.status != 200 {
		t.Fatalf("publish: %d %s", a.status, a.body)
	}
	g := call(t, h, "", "GET", "/v1/resources/r/payload", nil, nil)
	if g.status != 200 || !bytes.Equal(g.body, []byte("v1\x00")) || g.header.Get(server.HeaderGeneration) != "1" {
		t.Fatalf("get: %d %q generation %s", g.status, g.body, g.header.Get(server.HeaderGeneration))
	}
	p := want("busy", acq("r"), 409, server.TypeBusy)
	if p.Token != l.Token || p.LeaseUntil.IsZero() {
		t.Fatalf("busy names %s until %s, want the holder %s", p.Token, p.LeaseUntil, l.Token)
	}
	p = want("second publication", pub(l.Owner, l.Token, []byte("v2")), 412, server.TypeRefused)
	if p.Cause != string(fenced.CauseAlreadyPublished) || *p.Applied {
		t.Fatalf("refusal %+v", p)
	}
	want("not provisioned", acq("nope"), 404, server.TypeNotProvisioned)
	p = want("publish to an unprovisioned resource", call(t, h, "", "POST", "/v1/resources/nope/publish",
		map[string]string{server.HeaderOwner: l.Owner, server.HeaderToken: l.Token}, []byte("x")), 404, server.TypeNotProvisioned)
	if p.Cause != string(fenced.CauseNotProvisioned) {
		t.Fatalf("cause %q", p.Cause)
	}
	want("a bad token", pub(l.Owner, "1.0", nil), 400, server.TypeInvalid)
	want("a TTL of zero", call(t, h, "", "POST", "/v1/resources/r/acquire", nil, []byte(`{"ttl_ms":0}`)), 400, server.TypeInvalid)
	want("an unknown field", call(t, h, "", "POST", "/v1/resources/r/acquire", nil, []byte(`{"ttl_ms":1000,"tll":1}`)), 400, server.TypeInvalid)
	want("a JSON body past the limit", call(t, h, "", "POST", "/v1/resources/r/acquire", nil,
		append([]byte(`{"owner":"`), bytes.Repeat([]byte("a"), 70<<10)...)), 413, server.TypeTooLarge)
	want("a payload past the limit", pub(l.Owner, l.Token, make([]byte, store.MaxPayloadBytes()+1)), 413, server.TypeTooLarge)
	want("no such route", call(t, h, "", "DELETE", "/v1/resources/r", nil, nil), 404, server.TypeNotFound)

	// Epoch bump, then the old lease is refused as such and a new acquisition works.
	b := call(t, h, "", "POST", "/v1/epoch/bump", nil, nil)
	if b.status != 200 {
		t.Fatalf("bump: %d %s", b.status, b.body)
	}
	p = want("release after a bump", call(t, h, "", "POST", "/v1/resources/r/release", nil,
		mustJSON(t, map[string]string{"owner": l.Owner, "token": l.Token})), 412, server.TypeRefused)
	if p.Cause != string(fenced.CauseEpochBumped) {
		t.Fatalf("cause after a bump: %s", p.Cause)
	}
	if a := acq("r"); a.status != 200 {
		t.Fatalf("acquire after a bump: %d %s", a.status, a.body)
	}

	for _, name := range awkwardNames {
		if err := store.Provision(testCtx(t), name); err != nil {
			t.Fatal(err)
		}
	}
	rs := remoteStore(t, h, "")
	for _, name := range awkwardNames {
		l, err := rs.Acquire(testCtx(t), name, time.Minute)
		if err != nil {
			t.Fatalf("acquire %q through the service: %v", name, err)
		}
		if err := l.PublishAndRelease(testCtx(t), []byte(name+"\x00")); err != nil {
			t.Fatalf("publish %q: %v", name, err)
		}
		if got, _, err := store.Get(testCtx(t), name); err != nil || string(got) != name+"\x00" {
			t.Fatalf("the payload of %q, read directly: %q, %v", name, got, err)
		}
	}
}

// faulty fails the chosen call of the service's own driver.
type faulty struct {
	driver.Driver
	publish atomic.Pointer[func(driver.Driver, context.Context, driver.LeaseRef, driver.Publication) (bool, error)]
}

func (f *faulty) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	if fn := f.publish.Swap(nil); fn != nil {
		return (*fn)(f.Driver, ctx, l, p)
	}
	return f.Driver.Publish(ctx, l, p)
}

// TestDatabaseFailuresThroughService: what the service learns from its database reaches the
// client as the same certainty — not applied, read-only, or unknown and settled by op id.
func TestDatabaseFailuresThroughService(t *testing.T) {
	f := &faulty{Driver: sqliteBacking(t).open(t)}
	store := newStore(t, f)
	h := startServer(t, store, nil)
	if err := store.Provision(testCtx(t), "r"); err != nil {
		t.Fatal(err)
	}
	rs := remoteStore(t, h, "")
	l, err := rs.Acquire(testCtx(t), "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fail := func(err error, commit bool) {
		fn := func(d driver.Driver, ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
			if commit {
				if ok, err := d.Publish(ctx, l, p); !ok || err != nil {
					return ok, err
				}
			}
			return false, err
		}
		f.publish.Store(&fn)
	}

	fail(driver.NotApplied(errors.New("connection refused")), false)
	err = l.Publish(testCtx(t), []byte("a"))
	if err == nil || errors.Is(err, fenced.ErrOutcomeUnknown) || errors.Is(err, fenced.ErrRefused) || !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("publish the database did not carry out: %v, want not applied", err)
	}
	fail(driver.ReadOnly(errors.New("cannot execute UPDATE in a read-only transaction")), false)
	if err := l.Publish(testCtx(t), []byte("a")); !errors.Is(err, fenced.ErrReadOnly) || errors.Is(err, fenced.ErrOutcomeUnknown) {
		t.Fatalf("publish on a read-only database: %v, want read-only", err)
	}
	fail(&driver.PermissionError{Role: "fenced_ci", Operation: "publish", Resource: "r", Err: errors.New("permission denied for function")}, false)
	err = l.Publish(testCtx(t), []byte("a"))
	if !errors.Is(err, fenced.ErrPermissionDenied) || !errors.Is(err, driver.ErrNotApplied) || errors.Is(err, fenced.ErrOutcomeUnknown) {
		t.Fatalf("publish the database refused to the service's role: %v, want permission denied", err)
	}
	fail(errors.New("connection reset by peer"), true) // committed, then the answer was lost
	err = l.Publish(testCtx(t), []byte("committed\x00"), fenced.WithOpID("op-lost-at-the-server"))
	var unk *fenced.OutcomeUnknownError
	if !errors.As(err, &unk) || unk.OpID != "op-lost-at-the-server" {
		t.Fatalf("publish whose database reply was lost: %v, want outcome unknown", err)
	}
	r, err := rs.Resolve(testCtx(t), unk.OpID)
	if err != nil || !r.Accepted || r.Token != l.Token() {
		t.Fatalf("resolve: %+v, %v; want accepted with %s", r, err, l.Token())
	}
}

// TestClientClassifiesAnswers: the remote driver's certainty from answers that did not come
// from the service itself (a proxy's error page) or that say nothing was applied.
func TestClientClassifiesAnswers(t *testing.T) {
	for name, c := range map[string]struct {
		status     int
		ct, body   string
		notApplied bool
	}{
		"a proxy's 502 page":     {502, "text/html", "<html>bad gateway</html>", false},
		"a proxy's 504 page":     {504, "text/plain", "timeout", false},
		"outcome unknown":        {502, "application/problem+json", `{"type":"urn:fenced:problem:outcome-unknown","title":"t","status":502}`, false},
		"not applied":            {503, "application/problem+json", `{"type":"urn:fenced:problem:not-applied","title":"t","status":503,"applied":false}`, true},
		"a 503 without applied":  {503, "application/problem+json", `{"type":"urn:fenced:problem:unavailable","title":"t","status":503}`, false},
		"forbidden":              {403, "application/problem+json", `{"type":"urn:fenced:problem:forbidden","title":"t","status":403,"applied":false}`, true},
		"a 200 that is not JSON": {200, "text/html", "<html>", false},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", c.ct)
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.body)
			}))
			defer srv.Close()
			d := client(t, strings.TrimPrefix(srv.URL, "http://"), "")
			_, err := d.Acquire(testCtx(t), "r", "owner", time.Minute)
			if err == nil || errors.Is(err, driver.ErrNotApplied) != c.notApplied {
				t.Fatalf("acquire: %v; want not applied: %v", err, c.notApplied)
			}
			// Only the service's refusal to the token is permission denied (the command's exit 8).
			if forbidden := c.status == http.StatusForbidden; errors.Is(err, driver.ErrPermission) != forbidden {
				t.Fatalf("acquire: %v; want permission denied: %v", err, forbidden)
			}
			_, err = d.Publish(testCtx(t), driver.LeaseRef{Resource: "r", Owner: "o", Epoch: 2, Generation: 1}, driver.Publication{OpID: "x"})
			if err == nil || errors.Is(err, driver.ErrNotApplied) != c.notApplied {
				t.Fatalf("publish: %v; want not applied: %v", err, c.notApplied)
			}
		})
	}
}

// TestUTF8OwnersThroughService: an owner in any script, with spaces, is installed from the
// JSON body and named in Fenced-Owner percent-encoded; the remote driver does the same. A
// header that is not a correct percent-encoding, and an owner with a control character, are
// refused as invalid before anything is sent to the database.
func TestUTF8OwnersThroughService(t *testing.T) {
	h, store := sqliteService(t, nil)
	const resource = "ресурс ü 資源"
	if err := store.Provision(testCtx(t), resource); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	path := "/v1/resources/" + url.PathEscape(resource)
	const owner = "владелец 所有者 ü"
	a := call(t, h, "", "POST", path+"/acquire", nil, mustJSON(t, map[string]any{"ttl_ms": 60000, "owner": owner}))
	if a.status != 200 {
		t.Fatalf("acquire with owner %q: %d %s", owner, a.status, a.body)
	}
	var l server.Lease
	if err := json.Unmarshal(a.body, &l); err != nil {
		t.Fatal(err)
	}
	if l.Owner != owner {
		t.Fatalf("installed owner %q, want %q", l.Owner, owner)
	}
	pub := func(ownerHeader string) answer {
		return call(t, h, "", "POST", path+"/publish", map[string]string{"Content-Type": "application/octet-stream",
			server.HeaderOwner: ownerHeader, server.HeaderToken: l.Token}, []byte("v\x00"))
	}
	if a := pub("%zz"); a.status != 400 || a.problem(t).Type != server.TypeInvalid {
		t.Fatalf("a bad percent-encoding: %d %s, want 400 invalid", a.status, a.body)
	}
	if st, err := store.Show(testCtx(t), resource); err != nil || st.PublishedGeneration != 0 {
		t.Fatalf("after the refused request: %+v, %v; want nothing published", st, err)
	}
	if a := pub(url.PathEscape(owner)); a.status != 200 {
		t.Fatalf("publish as %q: %d %s", owner, a.status, a.body)
	}
	bad := call(t, h, "", "POST", path+"/release", nil, mustJSON(t, map[string]any{"owner": "a\u0007b", "token": l.Token}))
	if bad.status != 400 || bad.problem(t).Type != server.TypeInvalid {
		t.Fatalf("an owner with a control character: %d %s, want 400 invalid", bad.status, bad.body)
	}
	if a := call(t, h, "", "POST", path+"/release", nil, mustJSON(t, map[string]any{"owner": owner, "token": l.Token})); a.status != 204 {
		t.Fatalf("release as %q: %d %s", owner, a.status, a.body)
	}

	// The remote driver: acquire with a chosen owner, publish-and-release (Fenced-Owner).
	rs := remoteStore(t, h, "")
	rl, err := rs.Driver().Acquire(testCtx(t), resource, owner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ref := driver.LeaseRef{Resource: resource, Owner: owner, Epoch: rl.Epoch, Generation: rl.Generation}
	if ok, err := rs.Driver().PublishAndRelease(testCtx(t), ref, driver.Publication{OpID: "utf8-owner", Payload: []byte("w\x00")}); err != nil || !ok {
		t.Fatalf("publish-and-release through the remote driver as %q: %v, %v", owner, ok, err)
	}
	st, err := store.Show(testCtx(t), resource)
	if err != nil || st.Held() || st.PublishedGeneration != rl.Generation {
		t.Fatalf("after publish-and-release: %+v, %v", st, err)
	}
}
