package torture

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sync"
)

// Hold lets the nemesis stop a worker just before it sends its next publication, so that a
// fault lands exactly then instead of whenever the nemesis reads the worker's phase line (by
// which time, under load, the request is often out and answered). The nemesis writes lines to
// the worker's control stream:
//
//   - "hold publish" arms the hold: at its next publication (publish or publish_release) the
//     worker writes "held publish RESOURCE GENERATION" to its phase stream, before the
//     publication's CALL is recorded, and waits;
//   - "go" disarms the hold and lets a held worker go on.
//
// A worker also goes on when the stream ends (the nemesis is gone) or its context ends, so a
// hold never outlives the run. Safe for concurrent use: one goroutine reads the stream, the
// worker loop calls at.
type Hold struct {
	mu      sync.Mutex
	armed   bool
	release chan struct{} // non-nil while the worker is held; closed by "go"
	gone    chan struct{} // closed when the control stream ends
}

// NewHold reads control lines from r until it ends.
func NewHold(r io.Reader) *Hold {
	h := &Hold{gone: make(chan struct{})}
	go func() {
		defer close(h.gone)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			h.mu.Lock()
			switch sc.Text() {
			case "hold publish":
				h.armed = true
			case "go":
				h.armed = false
				if h.release != nil {
					close(h.release)
					h.release = nil
				}
			}
			h.mu.Unlock()
		}
	}()
	return h
}

// at is called before each publication: when the hold is armed, it reports the hold on phase
// and waits for "go". A nil Hold never holds.
func (h *Hold) at(ctx context.Context, phase io.Writer, resource string, generation int64) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if !h.armed {
		h.mu.Unlock()
		return
	}
	h.armed = false
	release := make(chan struct{})
	h.release = release
	h.mu.Unlock()
	if phase != nil {
		_, _ = fmt.Fprintf(phase, "held publish %s %d\n", resource, generation)
	}
	select {
	case <-release:
	case <-h.gone:
	case <-ctx.Done():
	}
	h.mu.Lock()
	if h.release == release {
		h.release = nil
	}
	h.mu.Unlock()
}
