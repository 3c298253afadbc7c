// Package peek tells, without waiting and without reading, whether a connection has
// something to read, has been closed by its peer, or neither: the check that the remote
// driver makes of an idle connection before reusing it, and that the service's loop makes
// of a waiting client before answering it.
package peek

// State is what a connection holds to read.
type State int

const (
	Unknown State = iota // the check is not possible (not on Unix, or not a socket)
	Nothing              // open, nothing to read yet
	Data                 // bytes are waiting
	Closed               // the peer closed or reset the connection, or it failed
)
