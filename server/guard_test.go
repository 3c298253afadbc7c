package server_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/server"
)

// TestNoTokensRefusesBrowsers: without a tokens file every loopback client is admin, so the
// requests a web page in the operator's browser could make are refused: another origin's
// (Origin, Sec-Fetch-Site), a rebound name's (Host), and a JSON body sent as another type,
// which a page may send across origins without a preflight. The CLI's requests (a loopback
// Host, neither header) and the dashboard's own (same origin) are answered.
func TestNoTokensRefusesBrowsers(t *testing.T) {
	h, store := sqliteService(t, nil)
	ctx := testCtx(t)
	if err := store.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	epoch := func() int64 {
		st, err := store.Show(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		return st.CurrentEpoch
	}
	_, port, _ := net.SplitHostPort(h.addr)
	acquire := mustJSON(t, map[string]any{"ttl_ms": 60000})
	refused := []struct {
		name, method, path string
		header             map[string]string
		body               []byte
		status             int
		typ                string
	}{
		{"bump from another site", "POST", "/v1/epoch/bump", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, nil, 403, server.TypeForbidden},
		{"bump with another origin only", "POST", "/v1/epoch/bump", map[string]string{"Origin": "https://evil.example"}, nil, 403, server.TypeForbidden},
		{"bump marked cross-site only", "POST", "/v1/epoch/bump", map[string]string{"Sec-Fetch-Site": "cross-site"}, nil, 403, server.TypeForbidden},
		{"bump from a page on another local port", "POST", "/v1/epoch/bump", map[string]string{"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"}, nil, 403, server.TypeForbidden},
		{"bump from an opaque origin", "POST", "/v1/epoch/bump", map[string]string{"Origin": "null"}, nil, 403, server.TypeForbidden},
		{"info for a rebound name", "GET", "/v1/info", map[string]string{"Host": "evil.example:7070"}, nil, 403, server.TypeForbidden},
		{"dashboard for a rebound name", "GET", "/v1/dashboard", map[string]string{"Host": "evil.example:" + port}, nil, 403, server.TypeForbidden},
		{"acquire as text/plain", "POST", "/v1/resources/r/acquire", map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, acquire, 415, server.TypeUnsupportedMediaType},
		{"acquire as a form", "POST", "/v1/resources/r/acquire", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, acquire, 415, server.TypeUnsupportedMediaType},
	}
	before := epoch()
	for _, c := range refused {
		a := call(t, h, "", c.method, c.path, c.header, c.body)
		if a.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, a.status, a.body, c.status)
			continue
		}
		if p := a.problem(t); p.Type != c.typ || p.Applied == nil || *p.Applied || p.Detail == "" {
			t.Errorf("%s: problem %+v", c.name, p)
		}
	}
	// A body with no Content-Type at all (a page's fetch with a Blob body sends none).
	req, err := http.NewRequestWithContext(ctx, "POST", h.url()+"/v1/resources/r/acquire", strings.NewReader(string(acquire)))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if _ = resp.Body.Close(); resp.StatusCode != 415 {
		t.Errorf("acquire without a Content-Type: %d, want 415", resp.StatusCode)
	}
	if got := epoch(); got != before {
		t.Fatalf("a refused bump changed the epoch from %d to %d", before, got)
	}
	if st, err := store.Show(ctx, "r"); err != nil || st.Held() {
		t.Fatalf("a refused acquisition took the lease: %+v, %v", st, err)
	}

	for _, c := range []struct {
		name, method, path string
		header             map[string]string
		body               []byte
	}{
		{"info as the CLI sends it", "GET", "/v1/info", nil, nil},
		{"info for localhost", "GET", "/v1/info", map[string]string{"Host": "localhost:" + port}, nil},
		{"info for [::1]", "GET", "/v1/info", map[string]string{"Host": "[::1]:" + port}, nil},
		{"dashboard read by its page", "GET", "/v1/dashboard", map[string]string{"Sec-Fetch-Site": "same-origin"}, nil},
		{"info typed into the address bar", "GET", "/v1/info", map[string]string{"Sec-Fetch-Site": "none"}, nil},
		{"bump as the CLI sends it", "POST", "/v1/epoch/bump", nil, nil},
		{"bump from the same origin", "POST", "/v1/epoch/bump", map[string]string{"Origin": "http://" + h.addr, "Sec-Fetch-Site": "same-origin"}, nil},
		{"bump from localhost's origin", "POST", "/v1/epoch/bump", map[string]string{"Host": "localhost:" + port, "Origin": "http://localhost:" + port}, nil},
		{"acquire as JSON", "POST", "/v1/resources/r/acquire", map[string]string{"Content-Type": "application/json; charset=utf-8"}, acquire},
	} {
		if a := call(t, h, "", c.method, c.path, c.header, c.body); a.status != 200 {
			t.Errorf("%s: %d %s, want 200", c.name, a.status, a.body)
		}
	}
	if got := epoch(); got == before {
		t.Fatal("the CLI's bump did not change the epoch")
	}
}

// TestTokensNotGuardedByHost: with a tokens file a browser cannot send the bearer secret by
// itself, so a service behind a proxy with a public name is answered; a JSON body must still
// be declared as JSON.
func TestTokensNotGuardedByHost(t *testing.T) {
	h, _, s := authService(t)
	if a := call(t, h, s.admin, "GET", "/v1/info", map[string]string{"Host": "fenced.example.com", "Origin": "https://fenced.example.com"}, nil); a.status != 200 {
		t.Errorf("info through a named proxy: %d %s", a.status, a.body)
	}
	a := call(t, h, s.workerAll, "POST", "/v1/resources/team%20a%2Fx/acquire", map[string]string{"Content-Type": "text/plain"}, mustJSON(t, map[string]any{"ttl_ms": 1000}))
	if a.status != 415 || a.problem(t).Type != server.TypeUnsupportedMediaType {
		t.Errorf("acquire as text/plain with a token: %d %s, want 415", a.status, a.body)
	}
}

// TestLoopRefusesBrowsers: the connection loop serves requests with the same guard as net/http.
func TestLoopRefusesBrowsers(t *testing.T) {
	_, _, addr, events := loopService(t, sqliteBacking(t).open(t))
	c, br := loopedConn(t, addr)
	if got := <-events; got != "loop" {
		t.Fatalf("event %q, want loop", got)
	}
	ask := func(what, req string, want int) {
		t.Helper()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Errorf("%s: %d %s, want %d", what, resp.StatusCode, b, want)
		}
	}
	ask("provision", "PUT /v1/resources/r HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n", 204)
	ask("bump from another site", "POST /v1/epoch/bump HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\nSec-Fetch-Site: cross-site\r\nContent-Length: 0\r\n\r\n", 403)
	ask("info for a rebound name", "GET /v1/info HTTP/1.1\r\nHost: evil.example:7070\r\n\r\n", 403)
	body := `{"ttl_ms":60000}`
	ask("acquire as text/plain", fmt.Sprintf("POST /v1/resources/r/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(body), body), 415)
	ask("show after the refusals", "GET /v1/resources/r HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 200)
	ask("info as the CLI sends it", "GET /v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 200)
	ask("acquire as JSON", fmt.Sprintf("POST /v1/resources/r/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body), 200)
}

// TestNoTokensHostNames: the Host names a loopback service answers to without tokens, and
// names that merely start or end like one.
func TestNoTokensHostNames(t *testing.T) {
	srv, err := server.New(newStore(t, sqliteBacking(t).open(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{
		"127.0.0.1": 200, "127.0.0.1:7070": 200, "127.4.5.6:1": 200, "localhost:7070": 200, "LocalHost": 200,
		"[::1]:7070": 200, "[::1]": 200, "[::ffff:127.0.0.1]:80": 200,
		"": 403, "evil.example": 403, "evil.example:7070": 403, "127.0.0.1.evil.example": 403, "localhost.evil.example:7070": 403,
		"0.0.0.0:7070": 403, "192.0.2.7:7070": 403, "[fe80::1%25lo]:7070": 403, "[::1%25lo]:7070": 403,
	} {
		req := httptest.NewRequest("GET", "/v1/info", nil)
		req.RemoteAddr, req.Host = "127.0.0.1:5000", host
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Host %q: %d %s, want %d", host, rec.Code, rec.Body, want)
		}
	}
}
