package torture

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Proxy is the delay fault's TCP proxy between the workers and one address of the database
// server: what tc netem would do on a kernel that has it, done in user space. Every
// connection a worker opens to the proxy is forwarded to the server; the nemesis can then
// delay the bytes (a base latency with jitter, order kept), stall connections (no byte passes
// either way for a while, then everything held goes through: what a lossy link looks like to
// TCP, whose retransmissions deliver late or never) and reset them (RST to both sides).
// It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[*proxyConn]struct{}
	latency time.Duration
	jitter  time.Duration
	rng     *rand.Rand // the jitter and the choice of connections, under mu
	closed  bool
	wg      sync.WaitGroup
}

// proxyConn is one proxied connection: the worker's side and the server's.
type proxyConn struct {
	client, server net.Conn
	stalledUntil   time.Time     // under Proxy.mu
	done           chan struct{} // closed by close
	once           sync.Once
}

// chunk is bytes read from one side, to be written to the other no earlier than due.
type chunk struct {
	data []byte
	due  time.Time
}

// NewProxy listens on a free loopback port and forwards every connection to target
// (host:port). seed makes the jitter and the choice of stalled or reset connections
// reproducible for one interleaving.
func NewProxy(target string, seed uint64) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("proxy target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}, rng: rand.New(rand.NewPCG(seed, 0x70726f7879))}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (host:port), to put in the workers' URL in place of target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.connect(c)
	}
}

// connect dials the server for the worker's connection c and forwards between them.
func (p *Proxy) connect(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close() // the server is down (a restart, a partition): the worker sees its connection closed
		return
	}
	pc := &proxyConn{client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pc.close(false)
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()
	p.serve(pc)
}

// serve forwards both directions of pc until either side closes or pc is reset.
func (p *Proxy) serve(pc *proxyConn) {
	var dirs sync.WaitGroup
	dirs.Add(2)
	go func() { defer dirs.Done(); p.pipe(pc, pc.client, pc.server) }()
	go func() { defer dirs.Done(); p.pipe(pc, pc.server, pc.client) }()
	dirs.Wait()
	pc.close(false)
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// pipe copies from src to dst through a queue: a reader stamps each chunk with when it may be
// written (never before the previous one: the order of the bytes is kept), a writer waits for
// that moment and for any stall of pc to end.
func (p *Proxy) pipe(pc *proxyConn, src, dst net.Conn) {
	queue := make(chan chunk, 64) // when full, the reader stops reading: TCP's back pressure
	go func() {
		defer close(queue)
		var last time.Time
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.delay())
				if due.Before(last) {
					due = last
				}
				last = due
				queue <- chunk{data: append([]byte(nil), buf[:n]...), due: due}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		for {
			wait := time.Until(c.due)
			p.mu.Lock()
			if s := time.Until(pc.stalledUntil); s > wait {
				wait = s
			}
			p.mu.Unlock()
			if wait <= 0 {
				break
			}
			if !hold(pc.done, wait) {
				break // reset or closed: the write below fails
			}
		}
		if _, err := dst.Write(c.data); err != nil {
			pc.close(false) // the other side is gone: end both directions
			break
		}
	}
	for range queue { // unblock the reader until src ends
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// hold waits for d (the fault itself: bytes held back) unless done is closed first; it
// reports whether it waited the whole time.
func hold(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// delay is one chunk's latency: the base plus a uniform draw in [-jitter, +jitter], never
// negative.
func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.latency
	if p.jitter > 0 {
		d += time.Duration(p.rng.Int64N(int64(2*p.jitter)+1)) - p.jitter
	}
	return max(d, 0)
}

// close ends both sides; reset sends RST rather than FIN (SO_LINGER 0).
func (pc *proxyConn) close(reset bool) {
	pc.once.Do(func() {
		close(pc.done)
		for _, c := range []net.Conn{pc.client, pc.server} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}

// SetLatency delays every byte from now on by latency ± jitter (0, 0: no delay).
func (p *Proxy) SetLatency(latency, jitter time.Duration) {
	p.mu.Lock()
	p.latency, p.jitter = latency, min(jitter, latency)
	p.mu.Unlock()
}

// Stall holds every byte of each open connection, chosen with probability frac, for d: they
// go through afterwards, late. It returns how many connections it stalled and how many were
// open.
func (p *Proxy) Stall(d time.Duration, frac float64) (stalled, open int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	until := time.Now().Add(d)
	for pc := range p.conns {
		open++
		if p.rng.Float64() < frac {
			pc.stalledUntil = until
			stalled++
		}
	}
	return stalled, open
}

// Reset sends RST to both sides of each open connection, chosen with probability frac, and
// drops what it held for them. It returns how many it reset and how many were open.
func (p *Proxy) Reset(frac float64) (reset, open int) {
	p.mu.Lock()
	var victims []*proxyConn
	for pc := range p.conns {
		open++
		if p.rng.Float64() < frac {
			victims = append(victims, pc)
		}
	}
	p.mu.Unlock()
	for _, pc := range victims {
		pc.close(true)
	}
	return len(victims), open
}

// Conns is how many connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, closes every connection and waits for the forwarding goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	open := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		open = append(open, pc)
	}
	p.mu.Unlock()
	for _, pc := range open {
		pc.close(false)
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

var _ io.Closer = (*Proxy)(nil)
