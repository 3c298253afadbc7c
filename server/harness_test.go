package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

func TestMain(m *testing.M) {
	// The dashboard's page is text; kin-openapi decodes text/plain but not text/html.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	goleak.VerifyTestMain(m)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var (
	docOnce sync.Once
	doc     *openapi3.T
	docErr  error
)

// openAPI loads and validates the embedded document once.
func openAPI(t testing.TB) *openapi3.T {
	t.Helper()
	docOnce.Do(func() {
		doc, docErr = openapi3.NewLoader().LoadFromData(server.OpenAPI)
		if docErr == nil {
			docErr = doc.Validate(context.Background())
		}
	})
	if docErr != nil {
		t.Fatalf("the OpenAPI document: %v", docErr)
	}
	return doc
}

// harness is one running service on a real loopback listener, as clients meet it: HTTP/1.1
// with keep-alive. Its store can be replaced (after a total loss of the database).
type harness struct {
	addr    string
	handler atomic.Pointer[http.Handler]
	checked atomic.Int64 // responses validated against the OpenAPI document
}

// startServer serves store with opts; every request and response is validated against the
// OpenAPI document, and a mismatch fails t.
func startServer(t testing.TB, store *fenced.Store, opts *server.Options) *harness {
	t.Helper()
	return startServerWith(t, store, opts, true)
}

// startServerWith starts the service, validating against the document only when validate is
// set (benchmarks measure the service alone).
func startServerWith(t testing.TB, store *fenced.Store, opts *server.Options, validate bool) *harness {
	t.Helper()
	h := &harness{}
	h.serve(t, store, opts)
	d := openAPI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !validate {
			(*h.handler.Load()).ServeHTTP(w, r)
			return
		}
		validating(t, d, *h.handler.Load(), &h.checked).ServeHTTP(w, r)
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-done
	})
	return h
}

// serve makes store the one the service answers from.
func (h *harness) serve(t testing.TB, store *fenced.Store, opts *server.Options) {
	t.Helper()
	s, err := server.New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	hd := s.Handler()
	h.handler.Store(&hd)
}

func (h *harness) url() string { return "http://" + h.addr }

// client opens a remote driver on the service at addr (the server's, or a proxy's).
func client(t testing.TB, addr, bearer string) *remote.Driver {
	t.Helper()
	return clientWith(t, addr, &remote.Options{BearerToken: bearer})
}

// syncClient is client with the transport that works on the calling goroutine.
func syncClient(t testing.TB, addr, bearer string) *remote.Driver {
	t.Helper()
	return clientWith(t, addr, &remote.Options{BearerToken: bearer, SyncTransport: true})
}

func clientWith(t testing.TB, addr string, opts *remote.Options) *remote.Driver {
	t.Helper()
	d, err := remote.Open("http://"+addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// validating records next's answer, checks request and answer against the document, then
// passes the answer on.
func validating(t testing.TB, d *openapi3.T, next http.Handler, checked *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())

		method, path, ok := strings.Cut(r.Pattern, " ")
		if !ok { // the catch-all "/" route: not an operation of the document
			return
		}
		if path == "/{$}" {
			path = "/"
		}
		item := d.Paths.Value(path)
		if item == nil || item.GetOperation(method) == nil {
			t.Errorf("route %s is served but not in the OpenAPI document", r.Pattern)
			return
		}
		params := map[string]string{}
		for _, p := range []string{"name", "id"} {
			if strings.Contains(path, "{"+p+"}") {
				params[p] = r.PathValue(p)
			}
		}
		opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}
		req := r.Clone(context.Background())
		req.Body = io.NopCloser(bytes.NewReader(body))
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Options: opts,
			Route: &routers.Route{Spec: d, Path: path, PathItem: item, Method: method, Operation: item.GetOperation(method)}}
		if rec.Code < 400 { // a rejected request is rejected on purpose (bad input tests)
			if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
				t.Errorf("%s %s: the request does not match the OpenAPI document: %v", r.Method, r.URL, err)
			}
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.Code, Header: rec.Header(), Options: opts}
		out.SetBodyBytes(rec.Body.Bytes())
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s %s: the %d answer does not match the OpenAPI document: %v\n%s", r.Method, r.URL, rec.Code, err, rec.Body.Bytes())
		}
		checked.Add(1)
	})
}

// newStore opens a fenced store over drv for the service.
func newStore(t testing.TB, drv driver.Driver) *fenced.Store {
	t.Helper()
	s, err := fenced.New(testCtx(t), drv, &fenced.Config{MaxPayloadBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
