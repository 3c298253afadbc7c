package torture

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer accepts connections and writes back every byte it reads; arrived receives the
// moment (CLOCK_MONOTONIC) each read returned, so that a test can see when bytes got through.
func echoServer(t *testing.T) (addr string, arrived <-chan int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan int64, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						select {
						case ch <- Now():
						default:
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String(), ch
}

func proxied(t *testing.T) (*Proxy, net.Conn, <-chan int64) {
	t.Helper()
	addr, arrived := echoServer(t)
	p, err := NewProxy(addr, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return p, c, arrived
}

// roundTrip writes msg and reads as many bytes back.
func roundTrip(t *testing.T, c net.Conn, msg []byte) []byte {
	t.Helper()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// The proxy passes every byte, NULs included, in order, with and without a latency.
func TestProxyForwardsInOrder(t *testing.T) {
	t.Parallel()
	p, c, _ := proxied(t)
	msg := bytes.Repeat([]byte("résumé\x00 torture\x00"), 20000) // several reads' worth
	if got := roundTrip(t, c, msg); !bytes.Equal(got, msg) {
		t.Fatal("the bytes came back altered")
	}
	p.SetLatency(20*time.Millisecond, 15*time.Millisecond) // jitter reorders nothing
	if got := roundTrip(t, c, msg); !bytes.Equal(got, msg) {
		t.Fatal("with a jittered latency, the bytes came back altered or reordered")
	}
	if p.Conns() != 1 {
		t.Errorf("%d connections open through the proxy, want 1", p.Conns())
	}
}

// A latency delays each direction: a round trip takes at least twice the base less the jitter.
func TestProxyLatency(t *testing.T) {
	t.Parallel()
	p, c, _ := proxied(t)
	const latency, jitter = 60 * time.Millisecond, 20 * time.Millisecond
	p.SetLatency(latency, jitter)
	for range 5 {
		start := time.Now()
		roundTrip(t, c, []byte("ping\x00"))
		if took := time.Since(start); took < 2*(latency-jitter) {
			t.Fatalf("a round trip took %s through a latency of %s ± %s each way", took, latency, jitter)
		}
	}
	p.SetLatency(0, 0)
}

// A stalled connection passes nothing until the stall is over, then everything held, late:
// the server sees the request only after the stall.
func TestProxyStallDeliversLate(t *testing.T) {
	t.Parallel()
	p, c, arrived := proxied(t)
	roundTrip(t, c, []byte("before")) // the connection is open through the proxy
	<-arrived
	const stall = 300 * time.Millisecond
	began := Now()
	if n, open := p.Stall(stall, 1); n != 1 || open != 1 {
		t.Fatalf("stalled %d of %d connections, want 1 of 1", n, open)
	}
	msg := []byte("held\x00across the stall")
	if got := roundTrip(t, c, msg); !bytes.Equal(got, msg) {
		t.Fatal("the held bytes came back altered")
	}
	if at := <-arrived; time.Duration(at-began) < stall {
		t.Fatalf("the server got the bytes %s into a stall of %s", time.Duration(at-began), stall)
	}
	// Connections opened after the stall are not stalled, and a stall of none stalls none.
	if n, _ := p.Stall(time.Hour, 0); n != 0 {
		t.Fatalf("a stall of fraction 0 stalled %d connections", n)
	}
}

// A reset connection ends with RST on the worker's side (connection reset), and the proxy
// forgets it; Close returns even while a connection is stalled.
func TestProxyReset(t *testing.T) {
	t.Parallel()
	p, c, _ := proxied(t)
	roundTrip(t, c, []byte("before"))
	if n, open := p.Reset(1); n != 1 || open != 1 {
		t.Fatalf("reset %d of %d connections, want 1 of 1", n, open)
	}
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset: %v, want connection reset", err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	roundTrip(t, c2, []byte("after"))
	p.Stall(time.Hour, 1)
	if _, err := c2.Write([]byte("held forever")); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil { // must not wait for the hour
		t.Fatal(err)
	}
}

func TestProxyRefusesBadTarget(t *testing.T) {
	t.Parallel()
	if _, err := NewProxy("no-port", 1); err == nil {
		t.Fatal("a target without a port was accepted")
	}
}
