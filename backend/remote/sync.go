package remote

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/internal/peek"
	"github.com/fenced-dev/fenced/internal/plainhttp"
)

// syncTransport is an HTTP/1.1 round tripper for one service that writes each request and
// reads its answer on the calling goroutine, over persistent connections it keeps idle
// between requests. net/http's Transport hands every request to a writing and a reading
// goroutine of the connection's; on an idle virtual CPU each hand-off waits for a wake-up,
// which costs more than the loopback round trip itself (docs/SERVICE.md, Numbers).
//
// It reports httptrace's GotConn once a connection is chosen and before anything is written,
// as net/http does, so that the driver's classification (nothing sent: not applied; anything
// after: outcome unknown) holds unchanged. It never sends a request twice: an idle connection
// that the service closed is detected before it is used and dropped; one closed in the
// moment between that check and the write makes the request's outcome unknown, as with
// net/http, which does not re-send a POST either. A connection is closed after any error and
// never reused. No proxy, no HTTP/2. Safe for concurrent use.
type syncTransport struct {
	dialer  net.Dialer
	tls     *tls.Config // nil for http://
	maxIdle int
	idleFor time.Duration // an idle connection older than this is closed rather than used

	mu     sync.Mutex
	idle   []*syncConn // most recently used last
	closed bool
}

type syncConn struct {
	net.Conn
	alive *peek.Peeker // of the TCP connection under TLS, for the liveness check
	br    *bufio.Reader
	bw    *bufio.Writer
	since time.Time // idle since
}

func newSyncTransport(tlsConf *tls.Config, https bool) *syncTransport {
	t := &syncTransport{dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}, maxIdle: 100, idleFor: 90 * time.Second}
	if https {
		t.tls = &tls.Config{}
		if tlsConf != nil {
			t.tls = tlsConf.Clone()
		}
		t.tls.NextProtos = []string{"http/1.1"}
	}
	return t
}

// headerSyncConnection asks the service to serve the connection on one goroutine
// (server.HeaderSyncConnection).
const headerSyncConnection = "Fenced-Connection"

// errTransportClosed is returned for requests after CloseIdleConnections made the transport
// refuse new ones (the driver's Close).
var errTransportClosed = errors.New("the connection pool is closed")

// CloseIdleConnections closes the idle connections; connections in use are closed when their
// request ends.
func (t *syncTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.closed = nil, true
	t.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}

// get returns an idle connection that still looks open, or a new one.
func (t *syncTransport) get(ctx context.Context, addr, host string) (*syncConn, bool, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, false, errTransportClosed
		}
		var c *syncConn
		if n := len(t.idle); n > 0 {
			c = t.idle[n-1]
			t.idle = t.idle[:n-1]
		}
		t.mu.Unlock()
		if c == nil {
			break
		}
		if time.Since(c.since) < t.idleFor && c.br.Buffered() == 0 && idleAlive(c.alive) {
			return c, true, nil
		}
		_ = c.Close()
	}
	raw, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	conn := raw
	if t.tls != nil {
		cfg := t.tls
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, false, err
		}
		conn = tc
	}
	return &syncConn{Conn: conn, alive: peek.NewPeeker(raw), br: bufio.NewReader(conn), bw: bufio.NewWriter(conn)}, false, nil
}

func (t *syncTransport) put(c *syncConn) {
	c.since = time.Now()
	t.mu.Lock()
	if t.closed || len(t.idle) >= t.maxIdle {
		t.mu.Unlock()
		_ = c.Close()
		return
	}
	t.idle = append(t.idle, c)
	t.mu.Unlock()
}

// longAgo is a deadline in the past: it ends a connection's reads and writes at once.
var longAgo = time.Unix(1, 0)

func (t *syncTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.roundTrip(req, nil)
}

// roundTrip is RoundTrip that also sets sent, when not nil, where it reports GotConn: the
// driver learns so without httptrace, whose context and hooks cost allocations per request.
func (t *syncTransport) roundTrip(req *http.Request, sent *atomic.Bool) (*http.Response, error) {
	ctx := req.Context()
	closeBody := func() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
	}
	if err := ctx.Err(); err != nil {
		closeBody()
		return nil, err
	}
	host := req.URL.Hostname()
	port := req.URL.Port()
	if port == "" {
		port = "80"
		if t.tls != nil {
			port = "443"
		}
	}
	c, reused, err := t.get(ctx, net.JoinHostPort(host, port), host)
	if err != nil {
		closeBody()
		return nil, err
	}
	if !reused {
		// A service with SyncConnections then serves the connection on one goroutine too.
		req = req.Clone(ctx)
		req.Header.Set(headerSyncConnection, "sync")
	}
	if sent != nil {
		sent.Store(true)
	}
	if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: c.Conn, Reused: reused})
	}
	var resp *http.Response
	err = t.bounded(ctx, c, func() (closing bool, err error) {
		resp, err = t.exchange(c, req)
		return err == nil && (resp.Close || req.Close), err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// bounded runs exchange on c within ctx, then keeps c for another request or closes it.
// The context bounds the exchange through the connection's deadline; its end cuts the
// exchange short (and the connection is then closed, since its state is unknown).
func (t *syncTransport) bounded(ctx context.Context, c *syncConn, exchange func() (closing bool, err error)) error {
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := neverStopped
	if ctx.Done() != nil { // else nothing can end ctx early, and AfterFunc's allocations are spared
		stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(longAgo) })
	}
	closing, err := exchange()
	if fired := !stop(); fired || err != nil {
		_ = c.Close()
		if err == nil {
			return nil // read in full before the context ended
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w: %v", ctxErr, err)
		}
		return err
	}
	if closing {
		_ = c.Close()
	} else {
		_ = c.SetDeadline(time.Time{})
		t.put(c)
	}
	return nil
}

// neverStopped is the stop function of a context that cannot end: nothing was to be stopped.
func neverStopped() bool { return true }

// roundTripPlain is roundTrip for a request of plainShape, written and read without
// net/http's request and response; it sets sent where roundTrip does.
func (t *syncTransport) roundTripPlain(ctx context.Context, p *plainRequest, sent *atomic.Bool) (plainAnswer, error) {
	if err := ctx.Err(); err != nil {
		return plainAnswer{}, err
	}
	c, reused, err := t.get(ctx, p.addr, p.name)
	if err != nil {
		return plainAnswer{}, err
	}
	sent.Store(true)
	var a plainAnswer
	err = t.bounded(ctx, c, func() (closing bool, err error) {
		writePlain(c.bw, p, !reused)
		if err = c.bw.Flush(); err != nil {
			return false, err
		}
		a, closing, err = readPlain(c.br, p.method)
		return closing, err
	})
	if err != nil {
		return plainAnswer{}, err
	}
	return a, nil
}

// exchange writes req and reads the whole answer, so that the connection is free again when
// it returns.
func (t *syncTransport) exchange(c *syncConn, req *http.Request) (*http.Response, error) {
	if err := req.Write(c.bw); err != nil {
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = &readBody{Reader: bytes.NewReader(body), b: body}
	return resp, nil
}

// readBody is an answer's body read in full; the driver takes its bytes without copying.
type readBody struct {
	*bytes.Reader
	b []byte
}

func (*readBody) Close() error { return nil }

// plainRequest is what the driver's own requests through a syncTransport carry; the
// transport writes it as http.Request.Write would write the same request, without building
// one (TestSyncPlainRequestAsNetHTTP in the server module compares the two).
type plainRequest struct {
	addr   string // host:port to dial
	name   string // the host's name, for TLS
	method string // GET, POST or PUT
	host   string // the Host header: the URL's host, of letters, digits and ".:-[]" only
	target string // the request target, escaped
	header http.Header
	token  string // the bearer token, "" for none
	body   []byte // nil for none
}

// plainAnswer is an answer read in full.
type plainAnswer struct {
	status int
	header http.Header
	body   []byte
}

// plainHost reports whether host is written in the Host header as it is: net/http rewrites
// international names, zones and anything after a slash or a space.
func plainHost(host string) bool {
	for i := 0; i < len(host); i++ {
		if c := host[i]; !plainhttp.Alnum(c) && strings.IndexByte(".:-[]", c) < 0 {
			return false
		}
	}
	return host != ""
}

// plainValue reports whether net/http writes v as it is in a header: printable ASCII, no
// white space at either end.
func plainValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c >= 0x7f {
			return false
		}
	}
	return v == "" || (v[0] != ' ' && v[len(v)-1] != ' ')
}

// plainShape reports whether writePlain writes p as http.Request.Write would write it.
func plainShape(p *plainRequest) bool {
	switch p.method {
	case http.MethodGet, http.MethodPost, http.MethodPut:
	default:
		return false
	}
	for k, vs := range p.header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer", "Authorization", headerSyncConnection:
			return false
		}
		if k != http.CanonicalHeaderKey(k) || !plainhttp.TokenOnly(k) || len(vs) != 1 || !plainValue(vs[0]) {
			return false
		}
	}
	return plainValue(p.token) && plainHost(p.host)
}

// writePlain writes p, of plainShape, as http.Request.Write writes it, with the header that
// asks for a looped connection when syncHeader is set.
func writePlain(bw *bufio.Writer, p *plainRequest, syncHeader bool) {
	var buf [8]string
	keys := buf[:0]
	for k := range p.header {
		keys = append(keys, k)
	}
	if p.token != "" {
		keys = append(keys, "Authorization")
	}
	if syncHeader {
		keys = append(keys, headerSyncConnection)
	}
	slices.Sort(keys)
	_, _ = bw.WriteString(p.method)
	_ = bw.WriteByte(' ')
	_, _ = bw.WriteString(p.target)
	_, _ = bw.WriteString(" HTTP/1.1\r\nHost: ")
	_, _ = bw.WriteString(p.host)
	_, _ = bw.WriteString("\r\nUser-Agent: Go-http-client/1.1\r\n")
	if len(p.body) > 0 || p.method != http.MethodGet {
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.WriteString(strconv.Itoa(len(p.body)))
		_, _ = bw.WriteString("\r\n")
	}
	for _, k := range keys {
		_, _ = bw.WriteString(k)
		_, _ = bw.WriteString(": ")
		switch k {
		case "Authorization":
			_, _ = bw.WriteString("Bearer ")
			_, _ = bw.WriteString(p.token)
		case headerSyncConnection:
			_, _ = bw.WriteString("sync")
		default:
			_, _ = bw.WriteString(p.header[k][0])
		}
		_, _ = bw.WriteString("\r\n")
	}
	_, _ = bw.WriteString("\r\n")
	_, _ = bw.Write(p.body)
}

// readPlain reads an answer as http.ReadResponse and io.ReadAll read it, without their
// costs when it has the service's usual shape (a status line of HTTP/1.1, header lines of
// token names and printable values, one Content-Length, no transfer coding, at most
// "Connection: close", the whole header buffered); any other answer is left to them.
// closing reports that the connection ends after it.
func readPlain(br *bufio.Reader, method string) (a plainAnswer, closing bool, err error) {
	if _, err := br.Peek(1); err == nil && method != http.MethodHead {
		if status, h, n, closing, ok := readPlainHead(br); ok {
			body := make([]byte, n)
			if _, err := io.ReadFull(br, body); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return plainAnswer{}, false, err
			}
			return plainAnswer{status: status, header: h, body: body}, closing, nil
		}
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return plainAnswer{}, false, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return plainAnswer{}, false, err
	}
	return plainAnswer{status: resp.StatusCode, header: resp.Header, body: body}, resp.Close, nil
}

// readPlainHead reads an answer's header, when it is of the usual shape and buffered in
// full, with its Content-Length; otherwise it reports false having consumed nothing.
func readPlainHead(br *bufio.Reader) (status int, h http.Header, length int, closing, ok bool) {
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return 0, nil, 0, false, false
	}
	head := buf[:end+2]
	// "HTTP/1.1 200 OK": a status from 200 to 999 other than 204 and 304, and a reason.
	if len(head) < 15 || string(head[:9]) != "HTTP/1.1 " || head[12] != ' ' || head[9] < '2' || head[9] > '9' {
		return 0, nil, 0, false, false
	}
	for _, c := range head[9:12] {
		if c < '0' || c > '9' {
			return 0, nil, 0, false, false
		}
		status = status*10 + int(c-'0')
	}
	if status == http.StatusNoContent || status == http.StatusNotModified {
		return 0, nil, 0, false, false
	}
	nl := bytes.IndexByte(head, '\n')
	if nl < 14 || head[nl-1] != '\r' || !plainhttp.Text(head[13:nl-1]) {
		return 0, nil, 0, false, false
	}
	h, ok = plainhttp.Header(string(head[nl+1:]))
	if !ok || h["Transfer-Encoding"] != nil || h["Trailer"] != nil {
		return 0, nil, 0, false, false
	}
	if c := h["Connection"]; c != nil {
		if len(c) != 1 || c[0] != "close" {
			return 0, nil, 0, false, false
		}
		closing = true
		delete(h, "Connection") // as http.ReadResponse
	}
	cl := h["Content-Length"]
	if len(cl) != 1 || cl[0] == "" || len(cl[0]) > 9 || strings.Trim(cl[0], "0123456789") != "" {
		return 0, nil, 0, false, false
	}
	length, _ = strconv.Atoi(cl[0])
	_, _ = br.Discard(end + 4)
	return status, h, length, closing, true
}
