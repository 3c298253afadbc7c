package remote

import "github.com/fenced-dev/fenced/internal/peek"

// idleAlive reports whether an idle connection is still open: nothing to read, not even the
// end of the stream. Data on an idle connection (a TLS close alert, say) counts as not alive,
// since no answer is due. Where the check is not possible (not on Unix) the connection counts
// as alive: one the service closed is then found when a request on it fails, and that
// request's outcome is unknown.
func idleAlive(p *peek.Peeker) bool {
	switch p.State() {
	case peek.Nothing, peek.Unknown:
		return true
	}
	return false
}
