package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// gated holds the next Acquire, once armed, until the test opens the gate.
type gated struct {
	driver.Driver
	armed      atomic.Bool
	attempting chan struct{}
	open       chan struct{}
}

func (d *gated) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	if d.armed.CompareAndSwap(true, false) {
		d.attempting <- struct{}{}
		<-d.open
	}
	return d.Driver.Acquire(ctx, resource, owner, ttl)
}

// parkedService is a service over SQLite whose waiting acquisitions are parked (no request
// validation in between, which would hide the connection), with the parked waiters' moments
// on events.
type parkedService struct {
	h      *harness
	srv    *server.Server
	store  *fenced.Store
	drv    *gated
	events chan string
	// takenOver, when set, runs just after a connection is taken over from net/http.
	takenOver atomic.Pointer[func()]
}

const parkedResource = "parked wait ü"

func newParkedService(t *testing.T) *parkedService {
	t.Helper()
	return newParkedServiceWith(t, nil)
}

func newParkedServiceWith(t *testing.T, opts *server.Options) *parkedService {
	t.Helper()
	g := &gated{Driver: sqliteBacking(t).open(t), attempting: make(chan struct{}), open: make(chan struct{})}
	// Polling hourly: only a release through the service wakes a waiter.
	store, err := fenced.New(testCtx(t), g, &fenced.Config{WaitPollMin: time.Hour, WaitPollMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv, err := server.New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	ps := &parkedService{srv: srv, store: store, drv: g, events: make(chan string, 64)}
	server.SetHook(srv, func(e string) { ps.events <- e })
	server.SetTakenOverHook(srv, func() {
		if f := ps.takenOver.Load(); f != nil {
			(*f)()
		}
	})
	ps.h = startServerWith(t, store, nil, false)
	hd := srv.Handler()
	ps.h.handler.Store(&hd)
	if err := store.Provision(testCtx(t), parkedResource); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return ps
}

// event waits for the parked waiters' next moment and checks it.
func (ps *parkedService) event(t *testing.T, want string) {
	t.Helper()
	select {
	case e := <-ps.events:
		if e != want {
			t.Fatalf("the service's next event is %q, want %q", e, want)
		}
	case <-testCtx(t).Done():
		t.Fatalf("no %q event", want)
	}
}

// events2 waits for two moments in either order.
func (ps *parkedService) events2(t *testing.T, a, b string) {
	t.Helper()
	ps.eventsAmong(t, []string{a, b})
}

// eventsAmong waits for every moment of want in any order, letting through those of pass
// (another connection's, whose timing the test does not set) in between.
func (ps *parkedService) eventsAmong(t *testing.T, want []string, pass ...string) {
	t.Helper()
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w] = true
	}
	for len(wanted) > 0 {
		select {
		case e := <-ps.events:
			if slices.Contains(pass, e) {
				continue
			}
			if !wanted[e] {
				t.Fatalf("the service's next event is %q, want one of %v", e, wanted)
			}
			delete(wanted, e)
		case <-testCtx(t).Done():
			t.Fatalf("no %v events", wanted)
		}
	}
}

// waiter is one client's connection with a waiting acquisition sent on it.
type waiter struct {
	conn net.Conn
	rd   *bufio.Reader
}

func (ps *parkedService) wait(t *testing.T) *waiter {
	t.Helper()
	return ps.waitMs(t, 60000)
}

// waitMs sends a waiting acquisition that waits at most waitMs.
func (ps *parkedService) waitMs(t *testing.T, waitMs int) *waiter {
	t.Helper()
	c, err := net.Dial("tcp", ps.h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	body := fmt.Sprintf(`{"ttl_ms":60000,"wait_ms":%d}`, waitMs)
	if _, err := fmt.Fprintf(c, "POST /v1/resources/parked%%20wait%%20%%C3%%BC/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body); err != nil {
		t.Fatal(err)
	}
	return &waiter{conn: c, rd: bufio.NewReader(c)}
}

// answer reads the waiter's answer.
func (w *waiter) answer(t *testing.T) (*http.Response, []byte) {
	t.Helper()
	if err := w.conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(w.rd, nil)
	if err != nil {
		t.Fatalf("reading the waiter's answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// metric reads one sample of the service's /metrics.
func (ps *parkedService) metric(t *testing.T, line string) float64 {
	t.Helper()
	m := call(t, ps.h, "", "GET", "/metrics", nil, nil)
	for l := range strings.Lines(string(m.body)) {
		if v, ok := strings.CutPrefix(l, line+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// metrics checks samples of /metrics.
func (ps *parkedService) metrics(t *testing.T, want map[string]float64) {
	t.Helper()
	for line, v := range want {
		if got := ps.metric(t, line); got != v {
			t.Errorf("%s %v, want %v", line, got, v)
		}
	}
}

func (ps *parkedService) hold(t *testing.T) *fenced.Lease {
	t.Helper()
	l, err := ps.store.Acquire(testCtx(t), parkedResource, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestParkedWaiterGranted: a waiting acquisition that has to wait is parked off net/http and
// granted when the lease is released through the service; its answer closes the connection.
// One granted at once is answered by the handler and keeps its connection.
func TestParkedWaiterGranted(t *testing.T) {
	ps := newParkedService(t)
	w := ps.wait(t)
	resp, b := w.answer(t)
	var first server.Lease
	if resp.StatusCode != 200 || resp.Close || json.Unmarshal(b, &first) != nil {
		t.Fatalf("a wait granted at once: %d close=%v %s", resp.StatusCode, resp.Close, b)
	}
	lease, err := ps.store.LeaseFor(parkedResource, first.Owner, fenced.Token{Epoch: first.Epoch, Generation: first.Generation})
	if err != nil {
		t.Fatal(err)
	}

	w = ps.wait(t)
	ps.event(t, "parked")
	if n := ps.metric(t, "fenced_waiters"); n != 1 {
		t.Fatalf("fenced_waiters %v while one waits", n)
	}
	if a := call(t, ps.h, "", "POST", "/v1/resources/parked%20wait%20%C3%BC/release", nil,
		mustJSON(t, map[string]string{"owner": lease.Owner(), "token": lease.Token().String()})); a.status != 204 {
		t.Fatalf("release: %d %s", a.status, a.body)
	}
	resp, b = w.answer(t)
	ps.event(t, "answered")
	var next server.Lease
	if resp.StatusCode != 200 || !resp.Close || json.Unmarshal(b, &next) != nil || next.Generation != first.Generation+1 ||
		next.Owner == "" || next.Resource != parkedResource || resp.Header.Get("Fenced-Request-Id") == "" ||
		resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("the parked waiter's answer: %d close=%v %v %s", resp.StatusCode, resp.Close, resp.Header, b)
	}
	if _, err := w.rd.ReadByte(); err != io.EOF {
		t.Fatalf("after its answer the connection is not closed: %v", err)
	}
	ps.metrics(t, map[string]float64{
		"fenced_waiters":                                         0,
		"fenced_requests_in_flight":                              1, // this scrape
		"fenced_handover_seconds_count":                          1,
		`fenced_wait_seconds_count{result="granted"}`:            2,
		`fenced_answers_total{operation="acquire",outcome="ok"}`: 2,
	})
}

// TestParkedWaiterHangsUp: a parked waiter whose client hangs up leaves the queue, and the
// next one is served.
func TestParkedWaiterHangsUp(t *testing.T) {
	ps := newParkedService(t)
	holder := ps.hold(t)
	first := ps.wait(t)
	ps.event(t, "parked")
	second := ps.wait(t)
	ps.event(t, "parked")
	_ = first.conn.Close()
	ps.events2(t, "gone", "answered") // the answer (to no one) may come first
	if err := holder.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	resp, b := second.answer(t)
	var l server.Lease
	if resp.StatusCode != 200 || json.Unmarshal(b, &l) != nil || l.Generation != holder.Generation()+1 {
		t.Fatalf("the second waiter: %d %s", resp.StatusCode, b)
	}
	ps.event(t, "answered")
	ps.metrics(t, map[string]float64{
		"fenced_waiters": 0,
		`fenced_wait_seconds_count{result="gone"}`:                        1,
		`fenced_answers_total{operation="acquire",outcome="client-gone"}`: 1,
	})
}

// TestParkedWaiterGrantAfterHangUp: the client hangs up while the waiter's attempt is with
// the database, and the attempt is granted: the service releases that lease at once.
func TestParkedWaiterGrantAfterHangUp(t *testing.T) {
	ps := newParkedService(t)
	holder := ps.hold(t)
	w := ps.wait(t)
	ps.event(t, "parked")
	ps.drv.armed.Store(true)
	if err := holder.Release(testCtx(t)); err != nil { // wakes the waiter at once
		t.Fatal(err)
	}
	<-ps.drv.attempting
	_ = w.conn.Close()
	ps.event(t, "gone")
	close(ps.drv.open)
	ps.event(t, "released")
	ps.event(t, "answered")
	st, err := ps.store.Show(testCtx(t), parkedResource)
	if err != nil {
		t.Fatal(err)
	}
	if st.Held() || st.Generation != holder.Generation()+1 {
		t.Fatalf("after a grant to a client that hung up: held=%v generation %d (holder's %d); want it granted and released",
			st.Held(), st.Generation, holder.Generation())
	}
}

// releaseTo releases holder and checks that the parked waiter w is granted.
func (ps *parkedService) releaseTo(t *testing.T, holder *fenced.Lease, w *waiter) {
	t.Helper()
	if err := holder.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if resp, b := w.answer(t); resp.StatusCode != 200 {
		t.Fatalf("the waiter after the release: %d %s", resp.StatusCode, b)
	}
	ps.event(t, "answered")
}

// TestParkedWaiterQueuedGivesUp: a waiter queued behind an earlier one whose wait ends is
// answered busy (409, applied false, with the holder the earlier waiter last heard of), not
// outcome unknown: it sent nothing to the database.
func TestParkedWaiterQueuedGivesUp(t *testing.T) {
	ps := newParkedService(t)
	holder := ps.hold(t)
	first := ps.waitMs(t, 60000)
	ps.event(t, "parked") // busy answered, and first in line
	second := ps.waitMs(t, 100)
	ps.event(t, "parked") // queued behind the first
	resp, b := second.answer(t)
	ps.event(t, "answered")
	var p server.Problem
	if resp.StatusCode != 409 || json.Unmarshal(b, &p) != nil || p.Type != server.TypeBusy || p.Applied == nil || *p.Applied ||
		p.Token != holder.Token().String() || p.Resource != parkedResource {
		t.Fatalf("a queued waiter whose wait ended: %d %s, want 409 busy, not applied, naming %s", resp.StatusCode, b, holder.Token())
	}
	ps.metrics(t, map[string]float64{
		"fenced_waiters": 1,
		`fenced_wait_seconds_count{result="busy"}`:                            1,
		`fenced_answers_total{operation="acquire",outcome="busy"}`:            1,
		`fenced_answers_total{operation="acquire",outcome="outcome-unknown"}`: 0,
		"fenced_outcomes_unknown_total":                                       0,
		"fenced_database_errors_total":                                        0,
	})
	ps.releaseTo(t, holder, first)
}

// TestParkedWaiterQueuedGivesUpHolderUnknown: the same while the earlier waiter's first
// attempt is still with the database: busy without a holder (no token), not "0.0".
func TestParkedWaiterQueuedGivesUpHolderUnknown(t *testing.T) {
	ps := newParkedService(t)
	holder := ps.hold(t)
	ps.drv.armed.Store(true)
	first := ps.waitMs(t, 60000)
	<-ps.drv.attempting // the first waiter's attempt is held at the database
	second := ps.waitMs(t, 100)
	ps.event(t, "parked") // the second, queued behind it
	resp, b := second.answer(t)
	ps.event(t, "answered")
	var p map[string]any
	if resp.StatusCode != 409 || json.Unmarshal(b, &p) != nil || p["type"] != server.TypeBusy || p["applied"] != false ||
		p["token"] != nil || p["generation"] != nil || p["lease_until"] != nil {
		t.Fatalf("a queued waiter whose wait ended, no holder known: %d %s, want 409 busy naming no holder", resp.StatusCode, b)
	}
	close(ps.drv.open)
	ps.event(t, "parked") // the first, busy
	ps.releaseTo(t, holder, first)
}

// pendingWhenTakenOver makes the next connection taken over from net/http report whether
// WaitAnswered counts it at that moment: http.Server.Shutdown stops waiting for it then.
func (ps *parkedService) pendingWhenTakenOver() <-chan bool {
	pending := make(chan bool, 1)
	f := func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // WaitAnswered returns at once: nil when nothing is pending
		select {
		case pending <- ps.srv.WaitAnswered(ctx) != nil:
		default:
		}
	}
	ps.takenOver.Store(&f)
	return pending
}

// TestParkedWaiterCountedWhenTakenOver: a waiter is counted by WaitAnswered from the moment
// its connection is taken over, so that a shutdown between the two does not close the store
// under it.
func TestParkedWaiterCountedWhenTakenOver(t *testing.T) {
	ps := newParkedService(t)
	holder := ps.hold(t)
	pending := ps.pendingWhenTakenOver()
	w := ps.wait(t)
	ps.event(t, "parked")
	if !<-pending {
		t.Fatal("WaitAnswered saw nothing pending just after a waiter's connection was taken over")
	}
	ps.releaseTo(t, holder, w)
}

// TestParkedWaiterShutdown: StopWaiting answers a parked waiter 503 with Retry-After, and
// WaitAnswered returns once it has been answered.
func TestParkedWaiterShutdown(t *testing.T) {
	ps := newParkedService(t)
	ps.hold(t)
	w := ps.wait(t)
	ps.event(t, "parked")
	ps.srv.StopWaiting()
	if err := ps.srv.WaitAnswered(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	select { // already answered when WaitAnswered returns
	case e := <-ps.events:
		if e != "answered" {
			t.Fatalf("the service's next event is %q, want answered", e)
		}
	default:
		t.Fatal("WaitAnswered returned before the parked waiter was answered")
	}
	resp, b := w.answer(t)
	var p server.Problem
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !resp.Close || json.Unmarshal(b, &p) != nil ||
		p.Type != server.TypeShuttingDown {
		t.Fatalf("a parked waiter at shutdown: %d %v %s", resp.StatusCode, resp.Header, b)
	}
}
