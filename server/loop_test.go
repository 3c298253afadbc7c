package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// gatedDriver holds acquisitions of the resource gated until release is closed.
type gatedDriver struct {
	driver.Driver
	gated   string
	entered chan struct{}
	release chan struct{}
}

func (g *gatedDriver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	if resource == g.gated {
		close(g.entered)
		<-g.release
	}
	return g.Driver.Acquire(ctx, resource, owner, ttl)
}

// loopService runs the service with SyncConnections the way fenced serve does, and returns
// its address and the events of its loops.
func loopService(t *testing.T, drv driver.Driver) (*server.Server, *http.Server, string, chan string) {
	s, err := server.New(newStore(t, drv), &server.Options{SyncConnections: true})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 16)
	server.SetHook(s, func(e string) {
		if strings.HasPrefix(e, "loop") {
			events <- e
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		s.StopWaiting()
		_ = hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
		if err := s.WaitAnswered(testCtx(t)); err != nil {
			t.Errorf("wait for the loops: %v", err)
		}
	})
	return s, hs, ln.Addr().String(), events
}

// A graceful shutdown with one looped connection idle and one in flight: the idle one is
// closed at once, the one in flight gets its answer, and WaitAnswered waits for it.
func TestLoopShutdown(t *testing.T) {
	g := &gatedDriver{Driver: sqliteBacking(t).open(t), gated: "busy ü", entered: make(chan struct{}), release: make(chan struct{})}
	s, hs, addr, events := loopService(t, g)
	ctx := testCtx(t)
	idle, busy := syncClient(t, addr, ""), syncClient(t, addr, "")
	for _, c := range []struct {
		d        *remote.Driver
		resource string
	}{{idle, "idle ü"}, {busy, "busy ü"}} {
		if err := c.d.Provision(ctx, c.resource); err != nil {
			t.Fatal(err)
		}
		if got := <-events; got != "loop" {
			t.Fatalf("event %q, want loop", got)
		}
	}
	for range 3 { // on the loop, the same connection
		if _, err := idle.Read(ctx, "idle ü"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case e := <-events:
		t.Fatalf("event %q: the loop did not keep the connection", e)
	default:
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := busy.Acquire(ctx, "busy ü", "owner ü", time.Minute)
		acquired <- err
	}()
	<-g.entered
	s.StopWaiting()
	if err := hs.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-events; got != "loop-end" { // the idle connection's, while the other is held
		t.Fatalf("event %q, want loop-end", got)
	}
	answered := make(chan error, 1)
	go func() { answered <- s.WaitAnswered(ctx) }()
	select {
	case err := <-answered:
		t.Fatalf("WaitAnswered returned (%v) while a request was in flight on a loop", err)
	case err := <-acquired:
		t.Fatalf("the held acquisition returned (%v) before its release", err)
	default:
	}
	close(g.release)
	if err := <-acquired; err != nil {
		t.Fatalf("the acquisition in flight at shutdown: %v", err)
	}
	if err := <-answered; err != nil {
		t.Fatalf("WaitAnswered: %v", err)
	}
	if _, err := idle.Read(ctx, "idle ü"); err == nil {
		t.Error("a request after the shutdown was answered")
	}
}

// loopedConn dials addr and asks, with its first request, for the connection to be looped.
func loopedConn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"+server.HeaderSyncConnection+": sync\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return c, br
}

// A request the loop cannot parse is answered 400 and the connection ends, as net/http does.
func TestLoopMalformedRequest(t *testing.T) {
	_, _, addr, events := loopService(t, sqliteBacking(t).open(t))
	c, br := loopedConn(t, addr)
	if got := <-events; got != "loop" {
		t.Fatalf("event %q, want loop", got)
	}
	// An answer of the loop's carries a Date, as net/http's do.
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("second request: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if _, err := http.ParseTime(resp.Header.Get("Date")); err != nil {
		t.Errorf("the loop's answer has no valid Date: %q", resp.Header.Get("Date"))
	}
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost x\x00\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusBadRequest || !resp.Close {
		t.Fatalf("malformed request: got %v %v, want 400 and Connection: close", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("after the 400 the connection is still open (%d, %v)", n, err)
	}
	if got := <-events; got != "loop-end" {
		t.Fatalf("event %q, want loop-end", got)
	}
}

// loopedClient is a store over a sync client of ps, once the client's first request has put
// its connection on the loop.
func loopedClient(t *testing.T, ps *parkedService) *fenced.Store {
	t.Helper()
	client, err := fenced.New(testCtx(t), syncClient(t, ps.h.addr, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	ps.event(t, "loop") // the client's first request
	return client
}

// A looped connection is counted by WaitAnswered from the moment it is taken over.
func TestLoopCountedWhenTakenOver(t *testing.T) {
	ps := newParkedServiceWith(t, &server.Options{SyncConnections: true})
	pending := ps.pendingWhenTakenOver()
	loopedClient(t, ps)
	if !<-pending {
		t.Fatal("WaitAnswered saw nothing pending just after a connection was taken over by the loop")
	}
}

// A waiting acquisition on a looped connection is parked as on net/http's: the loop hands
// the connection over and the waiter is granted at the release.
func TestLoopWaiterParked(t *testing.T) {
	ps := newParkedServiceWith(t, &server.Options{SyncConnections: true})
	holder := ps.hold(t)
	client := loopedClient(t, ps)
	got := remoteWaiter(t, client, testCtx(t), fenced.AsOwner("looped waiter ü"))
	ps.event(t, "parked")
	ps.event(t, "loop-end") // handed over, not closed
	if err := holder.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.lease.Generation() != holder.Generation()+1 {
		t.Fatalf("the looped waiter: %v, %v", r.lease, r.err)
	}
	ps.event(t, "answered")
}

// Over TLS the loop serves the connection as over TCP: one connection, taken over once, for
// every request of the client.
func TestLoopTLS(t *testing.T) {
	s, err := server.New(newStore(t, sqliteBacking(t).open(t)), &server.Options{SyncConnections: true})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 16)
	server.SetHook(s, func(e string) { events <- e })
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.StartTLS()
	t.Cleanup(func() {
		s.StopWaiting()
		srv.Close()
		if err := s.WaitAnswered(testCtx(t)); err != nil {
			t.Errorf("wait for the loops: %v", err)
		}
	})
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	d, err := remote.Open(srv.URL, &remote.Options{SyncTransport: true, TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ctx := testCtx(t)
	if err := d.Provision(ctx, "tls ü"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		g, err := d.Acquire(ctx, "tls ü", "owner ü", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Release(ctx, driver.LeaseRef{Resource: "tls ü", Owner: "owner ü", Epoch: g.Epoch, Generation: g.Generation}); err != nil {
			t.Fatal(err)
		}
	}
	if got := <-events; got != "loop" {
		t.Fatalf("event %q, want loop", got)
	}
	select {
	case e := <-events:
		t.Fatalf("event %q: the loop did not keep the TLS connection", e)
	default:
	}
}

// A waiting acquisition on a looped connection ends when its client goes away, as on
// net/http's: the client's context ends, its transport closes the connection, the parked
// waiter sees the hang-up, and the waiter count drops back to zero. The lease stays the
// holder's, and the loop's requests are counted by the same metrics as net/http's.
func TestLoopWaiterHangsUp(t *testing.T) {
	ps := newParkedServiceWith(t, &server.Options{SyncConnections: true})
	holder := ps.hold(t)
	client := loopedClient(t, ps)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	got := remoteWaiter(t, client, ctx, fenced.AsOwner("looped waiter ü"))
	ps.event(t, "parked")
	ps.event(t, "loop-end")
	if n := ps.metric(t, "fenced_waiters"); n != 1 {
		t.Fatalf("fenced_waiters %v while one waits", n)
	}
	cancel()
	if r := <-got; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v, %v", r.lease, r.err)
	}
	// The cancelled client settles its waiting acquisition's unknown outcome (Store.settleWait)
	// on a new connection, which the loop takes over too: its moments come in any order
	// beside the parked waiter's.
	ps.eventsAmong(t, []string{"gone", "answered"}, "loop", "loop-end")
	ps.metrics(t, map[string]float64{
		"fenced_waiters": 0,
		`fenced_wait_seconds_count{result="gone"}`:                        1,
		`fenced_answers_total{operation="acquire",outcome="client-gone"}`: 1,
	})
	st, err := ps.store.Show(testCtx(t), parkedResource)
	if err != nil {
		t.Fatal(err)
	}
	if st.Owner != holder.Owner() || st.Generation != holder.Generation() {
		t.Fatalf("after the waiter left: owner %q generation %d, want the holder's (%q, %d)", st.Owner, st.Generation, holder.Owner(), holder.Generation())
	}
}

// Expect on a looped connection is handled as net/http handles it: 100-continue is answered
// when the handler reads the body, a request answered without reading its body ends the
// connection (the client may or may not send that body), and any other expectation is 417.
func TestLoopExpectContinue(t *testing.T) {
	_, _, addr, events := loopService(t, sqliteBacking(t).open(t))
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	send := func(c net.Conn, s string) {
		if _, err := io.WriteString(c, s); err != nil {
			t.Fatal(err)
		}
	}
	read := func(br *bufio.Reader, what string) (*http.Response, string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	c, br := dial()
	send(c, "PUT /v1/resources/e%20%C3%BC HTTP/1.1\r\nHost: 127.0.0.1\r\n"+server.HeaderSyncConnection+": sync\r\nContent-Length: 0\r\n\r\n")
	if resp, b := read(br, "provision"); resp.StatusCode/100 != 2 {
		t.Fatalf("provision: %d %s", resp.StatusCode, b)
	}
	if got := <-events; got != "loop" {
		t.Fatalf("event %q, want loop", got)
	}
	body := `{"ttl_ms":60000,"owner":"owner ü"}`
	send(c, fmt.Sprintf("POST /v1/resources/e%%20%%C3%%BC/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body)))
	if resp, _ := read(br, "the interim answer"); resp.StatusCode != http.StatusContinue {
		t.Fatalf("the answer to Expect: 100-continue is %d, want 100 before the body is sent", resp.StatusCode)
	}
	send(c, body)
	if resp, b := read(br, "acquire"); resp.StatusCode != 200 || resp.Close || !strings.Contains(b, `"owner":"owner ü"`) {
		t.Fatalf("acquire after 100 Continue: %d close=%v %s", resp.StatusCode, resp.Close, b)
	}
	// Answered without its body being read: no 100, and the connection ends after the answer.
	send(c, "POST /v1/no-such-thing HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	if resp, _ := read(br, "an unknown path"); resp.StatusCode != http.StatusNotFound || !resp.Close {
		t.Fatalf("an unknown path with Expect: %d close=%v, want 404 and Connection: close", resp.StatusCode, resp.Close)
	}
	if got := <-events; got != "loop-end" {
		t.Fatalf("event %q, want loop-end", got)
	}

	c, br = loopedConn(t, addr)
	if got := <-events; got != "loop" {
		t.Fatalf("event %q, want loop", got)
	}
	send(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: something-else\r\n\r\n")
	if resp, _ := read(br, "an unknown expectation"); resp.StatusCode != http.StatusExpectationFailed || !resp.Close {
		t.Fatalf("an unknown expectation: %d close=%v, want 417 and Connection: close", resp.StatusCode, resp.Close)
	}
	if got := <-events; got != "loop-end" {
		t.Fatalf("event %q, want loop-end", got)
	}
}

// A client on a looped connection that hangs up while its waiting acquisition's first
// attempt is with the database: the attempt is granted, and the service releases that lease
// at once, as on net/http, though no background read told the request of the hang-up.
func TestLoopWaiterHangsUpDuringAttempt(t *testing.T) {
	for _, overTLS := range []bool{false, true} {
		name := "tcp"
		if overTLS {
			// A TLS client's close sends a close_notify alert ahead of its FIN, so the socket
			// shows bytes to read, not a closed connection.
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			ps := newParkedServiceWith(t, &server.Options{SyncConnections: true})
			before, err := ps.store.Show(testCtx(t), parkedResource)
			if err != nil {
				t.Fatal(err)
			}
			var c net.Conn
			if overTLS {
				c = loopedTLSConn(t, ps.srv)
			} else {
				c, _ = loopedConn(t, ps.h.addr)
			}
			ps.event(t, "loop")
			ps.drv.armed.Store(true)
			body := `{"ttl_ms":60000,"wait_ms":60000,"owner":"gone waiter ü"}`
			if _, err := fmt.Fprintf(c, "POST /v1/resources/parked%%20wait%%20%%C3%%BC/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				len(body), body); err != nil {
				t.Fatal(err)
			}
			<-ps.drv.attempting
			_ = c.Close()
			close(ps.drv.open)
			ps.event(t, "released")
			ps.event(t, "loop-end")
			st, err := ps.store.Show(testCtx(t), parkedResource)
			if err != nil {
				t.Fatal(err)
			}
			if st.Held() || st.Generation != before.Generation+1 {
				t.Fatalf("after a grant to a client that hung up: held=%v generation %d (was %d); want it granted and released",
					st.Held(), st.Generation, before.Generation)
			}
			ps.metrics(t, map[string]float64{
				"fenced_waiters": 0,
				`fenced_answers_total{operation="acquire",outcome="client-gone"}`: 1,
			})
		})
	}
}

// A TLS client that sends its next request before the answer to a waiting acquisition (HTTP/1.1
// pipelining) shows bytes on the socket too, as a closing one does: it gets its grant, and its
// next request is answered after it.
func TestLoopTLSRequestSentAheadDuringAttempt(t *testing.T) {
	ps := newParkedServiceWith(t, &server.Options{SyncConnections: true})
	c := loopedTLSConn(t, ps.srv)
	ps.event(t, "loop")
	ps.drv.armed.Store(true)
	body := `{"ttl_ms":60000,"wait_ms":60000,"owner":"pipelining waiter ü"}`
	if _, err := fmt.Fprintf(c, "POST /v1/resources/parked%%20wait%%20%%C3%%BC/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body); err != nil {
		t.Fatal(err)
	}
	<-ps.drv.attempting
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	close(ps.drv.open)
	rd := bufio.NewReader(c)
	for _, what := range []string{"the acquisition", "the request sent ahead"} {
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s answered %d, want 200", what, resp.StatusCode)
		}
	}
	st, err := ps.store.Show(testCtx(t), parkedResource)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held() || st.Owner != "pipelining waiter ü" {
		t.Fatalf("after the grant: %+v, want it held by the pipelining waiter", st)
	}
}

// loopedTLSConn serves srv's handler over TLS on a listener of its own and returns a client
// connection whose first request asked for the loop.
func loopedTLSConn(t *testing.T, srv *server.Server) net.Conn {
	t.Helper()
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.StartTLS()
	t.Cleanup(func() {
		srv.StopWaiting()
		ts.Close()
	})
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	c, err := tls.Dial("tcp", ts.Listener.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"+server.HeaderSyncConnection+": sync\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return c
}

// A client on a looped connection that closes the connection itself while its waiting
// acquisition is parked gives up its place: the waiter count drops, and at the holder's
// release the lease is not granted to the gone client but left free for the next holder.
func TestLoopWaiterClosesConnection(t *testing.T) {
	ps := newParkedServiceWith(t, &server.Options{SyncConnections: true})
	holder := ps.hold(t)
	c, _ := loopedConn(t, ps.h.addr)
	ps.event(t, "loop")
	body := `{"ttl_ms":60000,"wait_ms":60000,"owner":"closing waiter ü"}`
	if _, err := fmt.Fprintf(c, "POST /v1/resources/parked%%20wait%%20%%C3%%BC/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body); err != nil {
		t.Fatal(err)
	}
	ps.event(t, "parked") // the barrier: the waiter is parked before its client goes
	ps.event(t, "loop-end")
	if n := ps.metric(t, "fenced_waiters"); n != 1 {
		t.Fatalf("fenced_waiters %v while one waits", n)
	}
	_ = c.Close()
	ps.events2(t, "gone", "answered")
	ps.metrics(t, map[string]float64{
		"fenced_waiters": 0,
		`fenced_wait_seconds_count{result="gone"}`:                        1,
		`fenced_answers_total{operation="acquire",outcome="client-gone"}`: 1,
	})
	if err := holder.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	next, err := ps.store.Acquire(testCtx(t), parkedResource, time.Minute)
	if err != nil {
		t.Fatalf("the next holder after the waiter left: %v", err)
	}
	if next.Generation() != holder.Generation()+1 {
		t.Fatalf("the next holder has generation %d, want %d (nothing granted in between)", next.Generation(), holder.Generation()+1)
	}
}
