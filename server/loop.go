package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/internal/peek"
)

// HeaderSyncConnection is the request header that, with the value "sync", asks the service to
// serve the rest of the request's connection on one goroutine (Options.SyncConnections); the
// remote driver's SyncTransport sends it on a connection's first request.
const HeaderSyncConnection = "Fenced-Connection"

// Limits of a connection served by the loop where the http.Server sets none.
const (
	loopIdleTimeout   = 2 * time.Minute
	loopHeaderTimeout = 10 * time.Second
)

// serveHTTP is the service's handler: the mux, or, for a request that asks for it, the loop
// that serves its connection from then on.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.opts.SyncConnections || r.ProtoMajor != 1 || r.Header.Get(HeaderSyncConnection) != "sync" || s.stopping.Err() != nil {
		s.mux.ServeHTTP(w, r)
		return
	}
	// The body is read before the connection is taken over (net/http's reader must not be
	// used after); one larger than any the service accepts is left to net/http.
	limit := int64(max(s.store.MaxPayloadBytes(), maxJSONBytes)) + 1
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
	if err != nil || int64(len(body)) == limit {
		s.mux.ServeHTTP(w, r)
		return
	}
	// Counted before the Hijack, as a parked waiter is: WaitAnswered waits for the loop to end.
	s.parked.add()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.parked.done()
		s.mux.ServeHTTP(w, r)
		return
	}
	defer s.parked.done()
	if s.takenOver != nil {
		s.takenOver()
	}
	var src io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 { // pipelined: what net/http read ahead comes first
		ahead, _ := brw.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(ahead)), conn)
	}
	hs, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	l := &loop{s: s, conn: conn, src: &io.LimitedReader{R: src}, bw: brw.Writer, base: context.WithoutCancel(r.Context()),
		idleTimeout: loopIdleTimeout, headerTimeout: loopHeaderTimeout, maxHeader: http.DefaultMaxHeaderBytes}
	if hs != nil {
		if t := cmp(hs.IdleTimeout, hs.ReadTimeout); t > 0 {
			l.idleTimeout = t
		}
		if t := cmp(hs.ReadHeaderTimeout, hs.ReadTimeout); t > 0 {
			l.headerTimeout = t
		}
		if hs.MaxHeaderBytes > 0 {
			l.maxHeader = hs.MaxHeaderBytes
		}
		l.writeTimeout = hs.WriteTimeout
	}
	l.br = bufio.NewReader(l.src)
	l.remoteAddr = conn.RemoteAddr().String()
	r.Body = io.NopCloser(bytes.NewReader(body))
	stop := context.AfterFunc(s.stopping, l.stop)
	defer stop()
	if s.hook != nil {
		s.hook("loop")
		defer s.hook("loop-end")
	}
	l.run(r)
}

// cmp is the first of its arguments that is set.
func cmp(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

// loop serves one connection taken over from net/http: it reads a request, calls the mux,
// writes the answer, on this goroutine, without net/http's background read and its hand-offs
// between goroutines. It keeps the server's limits (header size and time, idle time, write
// time); a request's body is bounded by its handler, as under net/http. StopWaiting closes
// an idle connection at once and a busy one after its answer (which says Connection: close).
type loop struct {
	s                                        *Server
	conn                                     net.Conn
	src                                      *io.LimitedReader // bounds a request's header
	br                                       *bufio.Reader
	bw                                       *bufio.Writer
	base                                     context.Context
	idleTimeout, headerTimeout, writeTimeout time.Duration
	maxHeader                                int
	remoteAddr                               string   // the client's, set on every request
	date                                     []string // the last answer's Date header
	dateSec                                  int64    // the second it names

	mu      sync.Mutex
	idle    bool
	closing bool
}

// longAgo is a deadline in the past: it ends a connection's pending read at once.
var longAgo = time.Unix(1, 0)

func (l *loop) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closing = true
	if l.idle {
		_ = l.conn.SetReadDeadline(longAgo)
	}
}

func (l *loop) run(first *http.Request) {
	req := first
	for {
		keep, handed := l.serve(req, req == first)
		if handed {
			return // a parked waiter has the connection now
		}
		if !keep {
			_ = l.conn.Close()
			return
		}
		l.mu.Lock()
		if l.closing {
			l.mu.Unlock()
			_ = l.conn.Close()
			return
		}
		l.idle = true
		_ = l.conn.SetReadDeadline(time.Now().Add(l.idleTimeout))
		l.mu.Unlock()
		l.src.N = int64(l.maxHeader) + 4096 // as net/http, some slack for the request line
		_, err := l.br.Peek(1)
		l.mu.Lock()
		l.idle = false
		closing := l.closing
		l.mu.Unlock()
		if err != nil || closing {
			_ = l.conn.Close() // the client hung up, the idle time ran out, or the service stops
			return
		}
		// The usual request, already read in full, is parsed without http.ReadRequest's costs.
		var plain bool
		req, plain = readPlainRequest(l.br, l.maxHeader+4096)
		if !plain {
			_ = l.conn.SetReadDeadline(time.Now().Add(l.headerTimeout))
			req, err = http.ReadRequest(l.br)
		}
		l.src.N = math.MaxInt64 // the body is bounded by its handler
		if err != nil {
			l.refuse(err)
			_ = l.conn.Close()
			return
		}
		_ = l.conn.SetReadDeadline(time.Time{})
		if !l.expect(req) {
			_ = l.conn.Close()
			return
		}
	}
}

// expect handles a request's Expect header as net/http does: "100-continue" on an HTTP/1.1
// request with a body is answered with 100 Continue when the handler first reads the body;
// any other expectation is refused with 417 and the connection ends (it reports false).
// (The connection's first request is net/http's, which did the same before the loop began.)
func (l *loop) expect(r *http.Request) bool {
	ex := r.Header.Get("Expect")
	switch {
	case ex == "":
		return true
	case !strings.EqualFold(ex, "100-continue"):
		l.reject("417 Expectation Failed")
		return false
	case r.ProtoAtLeast(1, 1) && r.ContentLength != 0:
		r.Body = &continueReader{ReadCloser: r.Body, l: l}
	}
	r.Header.Del("Expect")
	return true
}

// continueReader writes 100 Continue before the first read of a request's body.
type continueReader struct {
	io.ReadCloser
	l    *loop
	sent bool
}

func (c *continueReader) Read(p []byte) (int, error) {
	if !c.sent {
		c.sent = true
		if c.l.writeTimeout > 0 {
			_ = c.l.conn.SetWriteDeadline(time.Now().Add(c.l.writeTimeout))
		}
		if _, err := c.l.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return 0, err
		}
		if err := c.l.bw.Flush(); err != nil {
			return 0, err
		}
	}
	return c.ReadCloser.Read(p)
}

// refuse answers a request that could not be read, as net/http does, and the connection ends.
func (l *loop) refuse(err error) {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return
	}
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		return
	}
	status := "400 Bad Request"
	if l.src.N <= 0 {
		status = "431 Request Header Fields Too Large"
	}
	l.reject(status)
}

// reject writes a plain answer that ends the connection.
func (l *loop) reject(status string) {
	_ = l.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(l.conn, "HTTP/1.1 "+status+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+status)
}

// serve answers one request; it reports whether the connection may carry another, or that
// a parked waiter took it over.
//
// The connection's first request is net/http's, and carries net/http's context, which ends
// with the connection's handler: it gets the loop's base instead (its values, never ended).
// The requests the loop reads itself carry none (context.Background) rather than a context
// of their own for each, which took three allocations (WithCancel, and WithContext's copy of
// the request): nothing ends a looped request's context anyway, since the loop learns of a
// hang-up only by asking the connection (hungUp), and every handler's use of it (the stores'
// reads, a waiting acquisition's context.AfterFunc) works the same on one that never ends.
func (l *loop) serve(r *http.Request, first bool) (keep, handed bool) {
	if first {
		r = r.WithContext(l.base)
	}
	r.RemoteAddr = l.remoteAddr
	if tc, ok := l.conn.(*tls.Conn); ok {
		st := tc.ConnectionState()
		r.TLS = &st
	}
	w := &loopWriter{header: http.Header{}, conn: l.conn, br: l.br, bw: l.bw}
	l.s.mux.ServeHTTP(w, r)
	if w.hijacked {
		return false, true
	}
	// Nothing of the request may be left unread, or the next one would start inside it. A
	// client that expected 100 Continue and was not told to send its body may send it or
	// not: the connection cannot carry another request (as under net/http).
	if cr, ok := r.Body.(*continueReader); ok && !cr.sent {
		keep = false
	} else {
		n, err := io.Copy(io.Discard, io.LimitReader(r.Body, 256<<10))
		keep = err == nil && n < 256<<10 && !r.Close
	}
	l.mu.Lock()
	keep = keep && !l.closing
	l.mu.Unlock()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if _, ok := w.header["Date"]; !ok { // as net/http: an origin server with a clock sends one
		w.header["Date"] = l.dateNow()
	}
	if l.writeTimeout > 0 {
		_ = l.conn.SetWriteDeadline(time.Now().Add(l.writeTimeout))
	}
	if writeAnswer(l.bw, r, w.status, w.header, w.body.Bytes(), !keep) != nil || l.bw.Flush() != nil {
		return false, false
	}
	return keep, false
}

// dateNow is the Date header for an answer written now, formatted once a second. The slice
// is shared by the answers of that second, which only write it.
func (l *loop) dateNow() []string {
	now := time.Now()
	if sec := now.Unix(); sec != l.dateSec || l.date == nil {
		l.date, l.dateSec = []string{now.UTC().Format(http.TimeFormat)}, sec
	}
	return l.date
}

// loopWriter holds a handler's answer until it returns, so that it is written with its length
// in one piece.
type loopWriter struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	conn     net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	hijacked bool
}

func (w *loopWriter) Header() http.Header { return w.header }

func (w *loopWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *loopWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}

// hungUp reports whether the client of w's request is known to have closed its connection.
// Only the loop needs asking: net/http's background read ends the request's context instead.
func hungUp(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *loopWriter:
			return x.gone()
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// tlsCloseRead bounds gone's read of one TLS record: the bytes are on the socket already.
const tlsCloseRead = 50 * time.Millisecond

// gone is hungUp for the loop's connection. Over TLS a client that closes sends a close_notify
// alert ahead of its FIN, so the socket shows bytes to read, not a closed connection: gone
// then reads them through TLS, into the loop's reader, where a request the client sent ahead
// stays for the loop to read next, and the alert reads as the end of the stream. The request
// being answered was read in full, so nothing of it is taken.
// TestLoopWaiterHangsUpDuringAttempt/tls closes a TLS client during the attempt.
func (w *loopWriter) gone() bool {
	tc, ok := w.conn.(*tls.Conn)
	if !ok {
		return peek.Conn(w.conn) == peek.Closed
	}
	switch peek.Conn(tc.NetConn()) {
	case peek.Closed:
		return true
	case peek.Data:
		if w.br.Buffered() > 0 {
			return false // a request sent ahead
		}
		_ = tc.SetReadDeadline(time.Now().Add(tlsCloseRead))
		_, err := w.br.Peek(1)
		_ = tc.SetReadDeadline(time.Time{})
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		return err != nil && !timedOut
	}
	return false
}

// Hijack hands the connection to a parked waiter; the loop ends.
func (w *loopWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.status != 0 {
		return nil, nil, errors.New("server: the answer has begun")
	}
	w.hijacked = true
	return w.conn, bufio.NewReadWriter(w.br, w.bw), nil
}
