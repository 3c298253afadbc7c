//go:build !unix

package peek

import "net"

// Conn cannot look without taking a byte here: it reports Unknown.
func Conn(net.Conn) State { return Unknown }
