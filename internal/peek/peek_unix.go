//go:build unix

package peek

import (
	"net"
	"syscall"
)

// Conn looks at what c holds to read, without waiting and without taking a byte.
func Conn(c net.Conn) State { return NewPeeker(c).State() }

// Peeker looks at one connection as Conn does, as often as asked, without allocating: the
// descriptor's handle and the callback that peeks are made once. Not safe for concurrent use.
type Peeker struct {
	raw  syscall.RawConn // nil when the connection is not a socket
	err  error           // from SyscallConn
	st   State
	b    [1]byte
	peek func(fd uintptr) bool
}

// NewPeeker returns a Peeker of c.
func NewPeeker(c net.Conn) *Peeker {
	p := &Peeker{}
	if sc, ok := c.(syscall.Conn); ok {
		p.raw, p.err = sc.SyscallConn()
	}
	p.peek = func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), p.b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK:
			p.st = Nothing
		case rerr == nil && n > 0:
			p.st = Data
		}
		return true // never wait for the descriptor to become readable
	}
	return p
}

// State is what the connection holds to read now.
func (p *Peeker) State() State {
	switch {
	case p.err != nil:
		return Closed
	case p.raw == nil:
		return Unknown
	}
	p.st = Closed // any error but "nothing yet" is a connection that failed
	if err := p.raw.Read(p.peek); err != nil {
		return Closed
	}
	return p.st
}
