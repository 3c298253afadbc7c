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
	"sync"
	"sync/atomic"
	"time"
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
	tcp   net.Conn // the TCP connection under TLS, for the liveness check
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
		if time.Since(c.since) < t.idleFor && c.br.Buffered() == 0 && idleAlive(c.tcp) {
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
	return &syncConn{Conn: conn, tcp: raw, br: bufio.NewReader(conn), bw: bufio.NewWriter(conn)}, false, nil
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
	// The context bounds the exchange through the connection's deadline; its end cuts the
	// exchange short (and the connection is then closed, since its state is unknown).
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(longAgo) })
	resp, err := t.exchange(c, req)
	if fired := !stop(); fired || err != nil {
		_ = c.Close()
		if err == nil {
			return resp, nil // read in full before the context ended
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w: %v", ctxErr, err)
		}
		return nil, err
	}
	if resp.Close || req.Close {
		_ = c.Close()
	} else {
		_ = c.SetDeadline(time.Time{})
		t.put(c)
	}
	return resp, nil
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
