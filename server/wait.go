package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
)

// A waiting acquisition can last minutes, and a service may hold thousands of them. net/http
// spends two goroutines and about 11 KiB of buffers on every connection, so a waiter that does
// have to wait is parked: the handler takes its connection over (Hijack) and returns, and the
// waiter then costs the goroutine that runs Store.AcquireWait, one goroutine reading the
// connection to notice a hang-up, and the connection itself. Its answer is written on the
// connection, which is closed after it (Connection: close). A waiter granted at once is
// answered by the handler and keeps its connection. Where a connection cannot be taken over
// (HTTP/2), the handler waits for the answer itself.

var (
	// errShuttingDown ends the waits of a server that is shutting down.
	errShuttingDown = errors.New("the service is shutting down")
	// errClientGone ends the wait of a client that hung up.
	errClientGone = errors.New("the client hung up")
)

// parkedWriteTimeout bounds the write of a parked waiter's answer.
const parkedWriteTimeout = 10 * time.Second

// waitResult is what Store.AcquireWait returned.
type waitResult struct {
	lease *fenced.Lease
	err   error
}

// waitCall is one waiting acquisition.
type waitCall struct {
	s        *Server
	resource string
	began    time.Time
	// base ends when the client hangs up (errClientGone) or the service stops waiting
	// (errShuttingDown); the wait's own deadline is a child of it, so that the cause read
	// after a grant is the client's, whatever ended the wait.
	base       context.Context
	cancel     context.CancelCauseFunc
	stopClient func() bool // stops net/http's context from ending base
}

func (s *Server) shuttingDown(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, r, Problem{Type: TypeShuttingDown, Status: http.StatusServiceUnavailable,
		Title: "the service is shutting down", Detail: "the wait ended because the service is shutting down; retry later or elsewhere", Applied: &no})
}

// acquireWait waits up to wait for the lease. The wait ends early when the client hangs up or
// the service shuts down (503 shutting-down); at its end the resource is still busy (409).
// A lease granted after its client hung up is released at once. A non-empty owner is installed
// by every attempt (fenced.AsOwner); otherwise the store draws one.
func (s *Server) acquireWait(w http.ResponseWriter, r *http.Request, resource, owner string, ttl, wait time.Duration) {
	if s.stopping.Err() != nil {
		s.shuttingDown(w, r)
		return
	}
	base, cancel := context.WithCancelCause(context.Background())
	c := &waitCall{s: s, resource: resource, began: time.Now(), base: base, cancel: cancel}
	c.stopClient = context.AfterFunc(r.Context(), func() { cancel(errClientGone) })
	stopStopping := context.AfterFunc(s.stopping, func() { cancel(errShuttingDown) })
	ctx, cancelWait := context.WithTimeout(base, wait)

	waiting := make(chan struct{})     // closed when the acquisition has to wait
	done := make(chan waitResult)      // the result, to the handler, unless it parked
	handover := make(chan *parking, 1) // the parked waiter, which then answers
	s.metrics.waiters.Inc()
	go func() {
		opts := []fenced.WaitOption{fenced.OnWaiting(func() { close(waiting) })}
		if owner != "" {
			opts = append(opts, fenced.AsOwner(owner))
		}
		l, err := s.store.AcquireWait(ctx, resource, ttl, opts...)
		cancelWait()
		stopStopping()
		res := waitResult{lease: l, err: err}
		select {
		case done <- res:
		case p := <-handover:
			p.answer(res)
		}
	}()
	var res waitResult
	select {
	case res = <-done:
	case <-waiting:
		rec, ok := w.(*recorder)
		if ok && s.park(rec, r, c, handover) {
			return
		}
		res = <-done
	}
	// On the loop nothing told the request's context of a hang-up during the attempt; ask
	// the connection, so that a grant nobody will read is released as on net/http.
	if hungUp(w) {
		cancel(errClientGone)
	}
	c.answer(w, r, res)
	c.stopClient()
	cancel(nil)
}

// answer writes the wait's result on w, or, when the client hung up first, writes nothing and
// releases a lease granted too late for it. It returns the lease it wrote.
func (c *waitCall) answer(w http.ResponseWriter, r *http.Request, res waitResult) *fenced.Lease {
	s := c.s
	s.metrics.waiters.Dec()
	gone := errors.Is(context.Cause(c.base), errClientGone)
	result := "other"
	switch {
	case gone:
		result = "gone"
	case res.err == nil:
		result = "granted"
	case errors.Is(res.err, fenced.ErrBusy):
		result = "busy"
	}
	s.metrics.waits.WithLabelValues(result).Observe(time.Since(c.began).Seconds())
	if gone {
		if rec, ok := w.(*recorder); ok {
			rec.gone = true
		}
		switch {
		case res.err == nil:
			c.releaseOrphan(res.lease)
		case errors.Is(res.err, fenced.ErrOutcomeUnknown):
			s.log.Warn("fenced serve: a waiting client hung up and its last attempt's outcome is unknown; a lease granted by it runs out at its TTL",
				"request_id", w.Header().Get(headerRequestID), "resource", c.resource, "error", res.err.Error())
		}
		return nil
	}
	if res.err != nil {
		// Not an unknown outcome: a statement cut short by the shutdown stays unknown.
		if errors.Is(context.Cause(c.base), errShuttingDown) && !errors.Is(res.err, fenced.ErrOutcomeUnknown) {
			s.shuttingDown(w, r)
			return nil
		}
		s.fail(w, r, res.err, true)
		return nil
	}
	l := res.lease
	s.metrics.granted(c.resource)
	writeJSON(w, http.StatusOK, Lease{Resource: c.resource, Owner: l.Owner(), Token: l.Token().String(), Epoch: l.Epoch(),
		Generation: l.Generation(), LeaseUntil: l.LeaseUntil()})
	return l
}

// releaseOrphan releases a lease whose client will never learn of it.
func (c *waitCall) releaseOrphan(l *fenced.Lease) {
	s := c.s
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.MutationTimeout)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		s.log.Warn("fenced serve: the lease granted to a waiting client that hung up was not released; it runs out at its TTL",
			"resource", c.resource, "token", l.Token().String(), "error", err.Error())
		return
	}
	s.metrics.released(c.resource)
	if s.hook != nil {
		s.hook("released")
	}
}

// parking is a waiter whose connection the service took over from net/http.
type parking struct {
	c    *waitCall
	conn net.Conn
	rec  *recorder
	out  *parkedWriter
	// The request's method and path, for the log: the request itself holds net/http's buffers.
	method, path string
	minor        int // the request's HTTP/1.x minor version
	answered     atomic.Bool
}

// park takes the request's connection over from net/http, so that the handler can return.
// It reports false, having changed nothing, when the connection cannot be taken over (HTTP/2,
// a test's recorder), when the request's body does not end after its JSON object, or when the
// client has already hung up.
func (s *Server) park(rec *recorder, r *http.Request, c *waitCall, handover chan<- *parking) bool {
	// Nothing of this request may be left unread on the connection.
	const rest = 4 << 10
	if n, err := io.Copy(io.Discard, io.LimitReader(r.Body, rest)); err != nil || n == rest {
		return false
	}
	if !c.stopClient() {
		return false // hung up already: the handler answers (to no one) and releases
	}
	// Counted before the Hijack: from it on, http.Server.Shutdown no longer waits for the
	// connection, and WaitAnswered must not miss it.
	s.parked.add()
	conn, brw, err := http.NewResponseController(rec).Hijack()
	if err != nil {
		s.parked.done()
		c.stopClient = context.AfterFunc(r.Context(), func() { c.cancel(errClientGone) })
		return false
	}
	if s.takenOver != nil {
		s.takenOver()
	}
	c.stopClient = nil // it would keep the request's contexts
	p := &parking{c: c, conn: conn, rec: rec, out: &parkedWriter{requestID: rec.Header().Get(headerRequestID)},
		method: r.Method, path: r.URL.Path, minor: r.ProtoMinor}
	rec.ResponseWriter, rec.parked = p.out, true
	switch {
	case r.Context().Err() != nil:
		c.cancel(errClientGone) // hung up between stopClient and Hijack
	case brw.Reader.Buffered() == 0:
		go p.watch()
	default:
		// The client sent more after its request (pipelining): as net/http does, the
		// connection is no longer watched for a hang-up; the answer's write still fails if
		// it is gone. What it sent is dropped with the connection after the answer.
	}
	if s.hook != nil {
		s.hook("parked")
	}
	handover <- p
	return true
}

// watch ends the wait when the client hangs up. A client says nothing while it waits, so a
// read that ends without data is the end of the connection.
func (p *parking) watch() {
	var b [1]byte
	n, err := p.conn.Read(b[:])
	if n == 0 && err != nil && !p.answered.Load() {
		p.c.cancel(errClientGone)
		if h := p.c.s.hook; h != nil {
			h("gone")
		}
	}
}

// answer writes the wait's result on the connection and closes it; a lease whose answer
// could not be written is released.
func (p *parking) answer(res waitResult) {
	s := p.c.s
	defer s.parked.done()
	l := p.c.answer(p.rec, &http.Request{Method: p.method, URL: &url.URL{Path: p.path}}, res)
	// Decided: a hang-up from now on (a client that closes once it has read the answer) is
	// not a waiter gone; a failed write below is handled by itself.
	p.answered.Store(true)
	if !p.rec.gone {
		if err := p.out.send(p.conn, p.minor); err != nil {
			s.log.Warn("fenced serve: the answer to a waiting client could not be written", "request_id",
				p.rec.Header().Get(headerRequestID), "resource", p.c.resource, "error", err.Error())
			if l != nil {
				p.rec.gone = true
				p.c.releaseOrphan(l)
			}
		}
	}
	_ = p.conn.Close()
	p.c.cancel(nil)
	p.rec.finish()
	if s.hook != nil {
		s.hook("answered")
	}
}

// parkedWriter collects a parked waiter's answer, written by the same code as any other.
type parkedWriter struct {
	requestID string
	header    http.Header // made with the answer: a waiter holds no map while it waits
	status    int
	body      bytes.Buffer
}

func (w *parkedWriter) Header() http.Header {
	if w.header == nil {
		w.header = http.Header{headerRequestID: {w.requestID}}
	}
	return w.header
}

func (w *parkedWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *parkedWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// send writes the answer as one HTTP/1.x response that closes the connection.
func (w *parkedWriter) send(conn net.Conn, minor int) error {
	w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
	resp := &http.Response{StatusCode: w.status, ProtoMajor: 1, ProtoMinor: minor, Header: w.header,
		ContentLength: int64(w.body.Len()), Body: io.NopCloser(&w.body), Close: true}
	var out bytes.Buffer
	if err := resp.Write(&out); err != nil {
		return err
	}
	if err := conn.SetWriteDeadline(time.Now().Add(parkedWriteTimeout)); err != nil {
		return err
	}
	_, err := conn.Write(out.Bytes())
	return err
}

// parkedSet counts the parked waiters not yet answered.
type parkedSet struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (ps *parkedSet) add() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n == 0 {
		ps.idle = make(chan struct{})
	}
	ps.n++
}

func (ps *parkedSet) done() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n--; ps.n == 0 {
		close(ps.idle)
		ps.idle = nil
	}
}

// WaitAnswered returns once every waiting acquisition whose connection the service took over
// from net/http has been answered, and every connection served by the loop
// (Options.SyncConnections) has ended, or when ctx ends (with its error). http.Server.Shutdown
// does not wait for those connections; a graceful shutdown calls StopWaiting, then Shutdown,
// then WaitAnswered.
func (s *Server) WaitAnswered(ctx context.Context) error {
	s.parked.mu.Lock()
	idle := s.parked.idle
	s.parked.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
