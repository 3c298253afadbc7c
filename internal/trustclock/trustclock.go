// Package trustclock is the clock of a lease's trust window. The window must keep counting
// while the process, the machine or its VM is stopped or suspended (docs/INVARIANTS.md, invariant
// 11), but Go's monotonic readings and its timers run on CLOCK_MONOTONIC, which stops during a
// suspend on Linux: a holder resumed after five minutes would trust its lease for the rest of
// a window that the database ended long ago. Here the time is read from a clock that counts
// suspended time (CLOCK_BOOTTIME on Linux), and a watch that runs while any Timer is pending
// notices a suspend (that clock gained on Go's) and brings every pending Timer up to date, so
// that a window that ended during the suspend ends within a second of resuming.
package trustclock

import (
	"sync"
	"sync/atomic"
	"time"
)

// Now is the time on the suspend-counting clock, from an arbitrary fixed point.
func Now() time.Duration { return read() + time.Duration(skipped.Load()) }

// skipped is time added to every reading by Suspend, in tests.
var skipped atomic.Int64

// Suspend makes the clock jump d ahead of Go's own, as a suspend of the machine for d would:
// the tests' stand-in for suspending the machine. It affects the whole process.
func Suspend(d time.Duration) { skipped.Add(int64(d)) }

// A Timer calls its function in its own goroutine once Now reaches its deadline, also when
// the deadline passed while the machine was suspended.
type Timer struct {
	f func()
	// Guarded by watch.mu: the Go timer of the current arming, which arming it is (a Go timer
	// of an earlier one that fired as Reset replaced it calls nothing), and the deadline.
	t        *time.Timer
	armed    uint64
	deadline time.Duration // on Now's clock
}

// AfterFunc calls f in its own goroutine once Now reaches deadline.
func AfterFunc(deadline time.Duration, f func()) *Timer {
	t := &Timer{f: f}
	watch.mu.Lock()
	defer watch.mu.Unlock()
	t.arm(deadline)
	return t
}

// arm starts a Go timer for deadline, a new arming. Called with watch.mu held.
func (t *Timer) arm(deadline time.Duration) {
	t.armed++
	armed := t.armed
	t.deadline = deadline
	t.t = time.AfterFunc(deadline-Now(), func() { t.fire(armed) })
	watch.pending(t)
}

func (t *Timer) fire(armed uint64) {
	watch.mu.Lock()
	if armed != t.armed { // Reset armed it again after this Go timer fired
		watch.mu.Unlock()
		return
	}
	delete(watch.timers, t)
	watch.mu.Unlock()
	t.f()
}

// Reset moves the deadline; the function runs again if it had run already, and an earlier
// deadline's run that had not started yet does not happen.
func (t *Timer) Reset(deadline time.Duration) {
	watch.mu.Lock()
	defer watch.mu.Unlock()
	t.t.Stop()
	t.arm(deadline)
}

// Stop keeps the function from running, if it has not started.
func (t *Timer) Stop() {
	watch.mu.Lock()
	defer watch.mu.Unlock()
	t.t.Stop()
	delete(watch.timers, t)
}

// every is how often the watch compares the two clocks while a Timer is pending.
const every = time.Second

// jump is how far the suspend-counting clock must gain on Go's between two looks for the
// watch to take it for a suspend; otherwise the two run at the same rate.
const jump = 20 * time.Millisecond

// watcher holds the pending Timers and, while there are any, compares the clocks every second
// from a time.AfterFunc of its own, so that no goroutine waits between the looks.
type watcher struct {
	mu       sync.Mutex
	timers   map[*Timer]struct{}
	look     *time.Timer // nil while no Timer is pending
	lastNow  time.Duration
	lastTime time.Time // Go's monotonic reading, taken with lastNow
}

var watch watcher

// pending records t as pending and starts the looks if they had stopped. Called with mu held.
func (w *watcher) pending(t *Timer) {
	if w.timers == nil {
		w.timers = map[*Timer]struct{}{}
	}
	w.timers[t] = struct{}{}
	if w.look == nil {
		w.lastNow, w.lastTime = Now(), time.Now()
		w.look = time.AfterFunc(every, Look)
	}
}

// Look compares the clocks now, as the watch does every second while a Timer is pending: if
// the suspend-counting clock gained on Go's since the last look, every pending Timer is
// brought up to date, and one whose deadline has passed fires at once. Tests call it to
// look without waiting for the next second.
func Look() {
	w := &watch
	w.mu.Lock()
	defer w.mu.Unlock()
	now, t := Now(), time.Now()
	if gained := (now - w.lastNow) - t.Sub(w.lastTime); gained > jump {
		for p := range w.timers {
			if p.t.Stop() { // pending, not fired: Go's clock did not count the suspend
				p.t.Reset(max(p.deadline-now, 0))
			}
		}
	}
	w.lastNow, w.lastTime = now, t
	if len(w.timers) == 0 {
		if w.look != nil {
			w.look.Stop()
			w.look = nil
		}
		return
	}
	if w.look != nil {
		w.look.Reset(every)
	}
}
