//go:build unix

package peek

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// until calls p.State until it reports want (loopback delivery is not instant), failing
// after a minute.
func until(t *testing.T, p *Peeker, want State) {
	t.Helper()
	end := time.Now().Add(time.Minute)
	for p.State() != want {
		if time.Now().After(end) {
			t.Fatalf("state %v, want %v", p.State(), want)
		}
		runtime.Gosched()
	}
}

// A Peeker reports nothing, then data without taking it, then the peer's close, and
// allocates nothing when asked again.
func TestPeeker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	p := NewPeeker(c)
	if st := p.State(); st != Nothing {
		t.Fatalf("a fresh connection: %v, want Nothing", st)
	}
	if n := testing.AllocsPerRun(100, func() { p.State() }); n != 0 {
		t.Errorf("%v allocations per look, want 0", n)
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	until(t, p, Data)
	if err := peer.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.State(); st != Data {
		t.Fatalf("a byte unread before the close: %v, want Data", st)
	}
	b := make([]byte, 1)
	if n, err := c.Read(b); n != 1 || b[0] != 'x' {
		t.Fatalf("the peeked byte was taken: %d %q %v", n, b, err)
	}
	until(t, p, Closed)
	if st := Conn(c); st != Closed {
		t.Errorf("Conn: %v, want Closed", st)
	}
	if st := NewPeeker(nil).State(); st != Unknown {
		t.Errorf("not a socket: %v, want Unknown", st)
	}
}
