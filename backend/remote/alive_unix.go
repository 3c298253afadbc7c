//go:build unix

package remote

import (
	"net"
	"syscall"
)

// idleAlive reports whether an idle connection is still open: nothing to read, not even the
// end of the stream. A peek that does not wait, so no byte is taken from the connection; data
// on an idle connection (a TLS close alert, say) counts as not alive, since no answer is due.
func idleAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait for the descriptor to become readable
	})
	return err == nil && alive
}
