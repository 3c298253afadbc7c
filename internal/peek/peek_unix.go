//go:build unix

package peek

import (
	"net"
	"syscall"
)

// Conn looks at what c holds to read, without waiting and without taking a byte.
func Conn(c net.Conn) State {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return Unknown
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return Closed
	}
	st := Closed // any error but "nothing yet" is a connection that failed
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK:
			st = Nothing
		case rerr == nil && n > 0:
			st = Data
		}
		return true // never wait for the descriptor to become readable
	})
	if err != nil {
		return Closed
	}
	return st
}
