package drivertest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// Proxy is a TCP proxy between a driver and its server that can lose a reply after the server
// has acted on the request: the client sent its statement, the server executed and committed
// it and answered, and the answer never arrives. It is safe for concurrent use.
//
// A hand-written proxy rather than toxiproxy: it does exactly one thing, deterministically (the
// first server bytes after arming are dropped and both sides closed), and keeps toxiproxy's
// server dependencies out of the core module.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	armed  bool
	match  func([]byte) bool // when set, only a connection whose request matched is armed
	marked net.Conn          // the server connection whose next reply is lost
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartProxy listens on a loopback port and forwards every connection to upstream (host:port).
// It is closed in t.Cleanup.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port, to give the driver instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// LoseNextReply arms the proxy: the next bytes any server connection sends are discarded, and
// that connection is closed on both sides.
func (p *Proxy) LoseNextReply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = true
}

// LoseReplyTo arms the proxy for one request: after a client sends bytes containing marker (an
// operation id, say), the next bytes the server sends on that connection are discarded and the
// connection is closed. Requests before it, on any connection, are answered normally.
func (p *Proxy) LoseReplyTo(marker []byte) {
	marker = append([]byte(nil), marker...)
	p.LoseReplyToRequest(func(chunk []byte) bool { return bytes.Contains(chunk, marker) })
}

// LoseReplyToRequest is LoseReplyTo with a predicate over what the client writes: the reply to
// the first request for which match is true is lost. A protocol-aware test uses it to skip
// requests that change nothing (a statement's preparation, say).
func (p *Proxy) LoseReplyToRequest(match func(request []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.match, p.marked = false, match, nil
}

// sawRequest arms server's connection if chunk is the request to lose the reply to.
func (p *Proxy) sawRequest(server net.Conn, chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.match != nil && p.match(chunk) {
		p.match, p.marked = nil, server
	}
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client) || !p.track(server) {
			_ = client.Close()
			_ = server.Close()
			continue
		}
		p.wg.Add(2)
		go func() { // client to server: copied, watching for the marker
			defer p.wg.Done()
			defer server.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					p.sawRequest(server, buf[:n])
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server to client: the reply that may be lost
			defer p.wg.Done()
			defer client.Close()
			defer server.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 {
					if p.takeArmed(server) {
						return // both sides are closed by the defers: the reply is gone
					}
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// takeArmed disarms the proxy and reports whether this server connection's reply is to be lost.
func (p *Proxy) takeArmed(server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.armed:
		p.armed = false
	case p.marked == server:
		p.marked = nil
	default:
		return false
	}
	return true
}

// ClosedAddr returns a loopback address where nothing listens: a driver pointed at it can never
// deliver a request.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// errLostReply is what LoseReplies returns after the operation has taken effect.
var errLostReply = errors.New("connection lost after the request was sent (injected)")

// LoseReplies wraps a driver for engines without a network between client and engine (SQLite):
// once arm has been called, the next mutation is carried out for real and then reports an error
// instead of its result, as a lost reply would. Reads are not affected.
func LoseReplies(d driver.Driver) (drv driver.Driver, arm func()) {
	l := &lossy{Driver: d}
	return l, func() { l.mu.Lock(); l.armed = true; l.mu.Unlock() }
}

type lossy struct {
	driver.Driver
	mu    sync.Mutex
	armed bool
}

func (l *lossy) lose(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed && err == nil {
		l.armed = false
		return errLostReply
	}
	return err
}

func (l *lossy) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	g, err := l.Driver.Acquire(ctx, resource, owner, ttl)
	return g, l.lose(err)
}

func (l *lossy) Renew(ctx context.Context, ref driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	u, ok, err := l.Driver.Renew(ctx, ref, ttl)
	return u, ok, l.lose(err)
}

func (l *lossy) Publish(ctx context.Context, ref driver.LeaseRef, p driver.Publication) (bool, error) {
	ok, err := l.Driver.Publish(ctx, ref, p)
	return ok, l.lose(err)
}

func (l *lossy) PublishAndRelease(ctx context.Context, ref driver.LeaseRef, p driver.Publication) (bool, error) {
	ok, err := l.Driver.PublishAndRelease(ctx, ref, p)
	return ok, l.lose(err)
}

func (l *lossy) Release(ctx context.Context, ref driver.LeaseRef) (bool, error) {
	ok, err := l.Driver.Release(ctx, ref)
	return ok, l.lose(err)
}
