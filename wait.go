package fenced

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// Default polling bounds of AcquireWait (Config.WaitPollMin and WaitPollMax).
const (
	DefaultWaitPollMin = 5 * time.Millisecond
	DefaultWaitPollMax = time.Second
)

// AcquireWait is Acquire that waits while the resource is busy: it returns the lease once an
// acquisition is granted, or the first error other than busy, or, when ctx ends first, an
// error matching both ErrBusy (the last *BusyError) and ctx's error. ctx ends the waiting
// between attempts; an attempt already sent runs to its answer (for at most
// Config.ReleaseTimeout), so the end of ctx does not by itself make an acquisition's outcome
// unknown, and a grant that arrives just after ctx ended is returned. An attempt can still end
// with an unknown outcome of its own (a lost reply, or ReleaseTimeout reached). The tests end
// ctx only between attempts (TestAcquireWaitGivesUpWithCtx); ctx ending mid-attempt is not
// forced by a test.
//
// Each attempt is Acquire's one conditional statement; nothing is decided in Go. Between
// attempts the waiter sleeps with a capped, jittered back-off (Config.WaitPollMin and
// WaitPollMax), and never past the moment the holder's lease runs out as the database's clock
// judges it (the row's expiry minus the database's now, read after the busy answer; a lease
// found already free by that read is retried at once): a waiter never compares the database's
// times with its own clock. A lease released through this Store wakes the next waiter at once.
//
// Waiters of one resource in one Store are served first come, first served: only the
// longest-waiting one asks the database, and the next starts when it leaves. Across Stores and
// processes there is no order: whoever's statement comes first after the lease is free wins.
// Where the driver can signal freed leases (driver.ReleaseNotifier: PostgreSQL's
// LISTEN/NOTIFY, an etcd watch on the owner and epoch keys, Redis pub/sub published by the
// scripts), a release, publish-and-release or epoch bump anywhere (and on etcd the end of the
// lease's TTL) wakes the first waiter of every Store at once, while the Store's listening
// connection is up; without it, the waiters fall back to the polling above
// (drivertest's WaiterWokenBySignal and WaiterRetriesAtExpiry).
func (s *Store) AcquireWait(ctx context.Context, resource string, ttl time.Duration, opts ...WaitOption) (*Lease, error) {
	if err := validResource(resource); err != nil {
		return nil, err
	}
	if _, err := s.margin(ttl); err != nil {
		return nil, err
	}
	var o waitOptions
	for _, opt := range opts {
		opt(&o)
	}
	w := s.waits.join(resource)
	defer s.waits.leave(resource, w)
	select {
	case <-w.turn:
	default:
		o.waiting() // queued behind an earlier waiter
		select {
		case <-w.turn:
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire %q: gave up waiting for the waiters before it: %w", resource, ctx.Err())
		}
	}
	// The attempts run in a function of their own: its frame is large, and a waiter queued
	// behind others (thousands of them, in a service) then waits on a small stack.
	return s.acquireWaitTurn(ctx, resource, ttl, w, &o)
}

// acquireWaitTurn is AcquireWait once the waiter is the first of its resource.
func (s *Store) acquireWaitTurn(ctx context.Context, resource string, ttl time.Duration, w *waiter, o *waitOptions) (*Lease, error) {
	// Subscribed before the first attempt, so that a release between a busy answer and the
	// sleep that follows still wakes this waiter.
	var freed <-chan struct{}
	if n, ok := s.drv.(driver.ReleaseNotifier); ok {
		if ch, stop, err := n.NotifyReleased(ctx, resource); err == nil {
			freed = ch
			defer stop()
		} else if s.waits.hook != nil {
			s.waits.hook("no-signal", 0)
		}
	}
	poll := s.cfg.WaitPollMin
	attemptTimeout := s.cfg.ReleaseTimeout
	if attemptTimeout == 0 {
		attemptTimeout = DefaultReleaseTimeout
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acquire %q: not sent: %w", resource, err)
	}
	for {
		// ctx bounds the waiting, not an attempt: one that has been sent finishes (for at most
		// Config.ReleaseTimeout), so that the end of a wait makes no outcome unknown.
		// The read that times the retry is detached too: a statement cut short by ctx is not
		// needed, and cancelling one can disturb the connection it ran on.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attemptTimeout)
		l, err := s.Acquire(actx, resource, ttl)
		var busy *BusyError
		if !errors.As(err, &busy) {
			cancel()
			return l, err
		}
		o.waiting()
		delay := poll
		if st, rerr := s.Show(actx, resource); rerr == nil {
			// Free by now (the lease ran out or was released since the busy answer): retry
			// at once. Held: retry when it runs out by the database's clock, or sooner.
			left := time.Duration(0)
			if st.Held() {
				left = st.LeaseUntil.Sub(st.Now)
			}
			delay = min(delay, max(left, 0))
		}
		cancel()
		// Jitter within the lower half, so that waiters of several processes spread out; the
		// lease's end is never overshot.
		delay -= rand.N(delay/2 + 1)
		poll = min(2*poll, s.cfg.WaitPollMax)
		if s.waits.hook != nil {
			s.waits.hook("sleep", delay)
		}
		if s.waits.fixedDelay > 0 {
			delay = s.waits.fixedDelay
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up waiting: %w)", busy, ctx.Err())
		case <-w.wake:
			t.Stop()
			poll = s.cfg.WaitPollMin
		case <-freed: // the engine's signal: freed somewhere, perhaps in another process
			t.Stop()
			poll = s.cfg.WaitPollMin
		case <-t.C:
		}
	}
}

// WaitOption adjusts one AcquireWait.
type WaitOption func(*waitOptions)

type waitOptions struct {
	onWaiting func()
}

// waiting calls the OnWaiting function the first time only.
func (o *waitOptions) waiting() {
	if f := o.onWaiting; f != nil {
		o.onWaiting = nil
		f()
	}
}

// OnWaiting makes AcquireWait call f once, on the caller's goroutine, when the acquisition
// first has to wait: when it queues behind an earlier waiter of the same Store, or after its
// first busy answer (before it sleeps). It is not called when the first attempt is granted or
// fails with another error. f must return quickly; the service uses it to take a request's
// connection over from net/http only when the request does wait.
func OnWaiting(f func()) WaitOption { return func(o *waitOptions) { o.onWaiting = f } }

// waitQueues holds the waiters of one Store, per resource, in arrival order. The zero value
// is ready to use.
type waitQueues struct {
	mu     sync.Mutex
	queues map[string][]*waiter
	// hook, set by tests before any waiter, sees "join" and each "sleep" with its delay.
	hook func(event string, d time.Duration)
	// fixedDelay, set by tests, replaces every sleep's delay: a waiter that must be woken by a
	// signal is given one that would outlast the test.
	fixedDelay time.Duration
}

type waiter struct {
	turn chan struct{} // closed when this waiter is the first of its resource
	wake chan struct{} // a lease of the resource was released through this Store
}

func (q *waitQueues) join(resource string) *waiter {
	w := &waiter{turn: make(chan struct{}), wake: make(chan struct{}, 1)}
	q.mu.Lock()
	if q.queues == nil {
		q.queues = map[string][]*waiter{}
	}
	q.queues[resource] = append(q.queues[resource], w)
	if len(q.queues[resource]) == 1 {
		close(w.turn)
	}
	q.mu.Unlock()
	if q.hook != nil {
		q.hook("join", 0)
	}
	return w
}

func (q *waitQueues) leave(resource string, w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ws := q.queues[resource]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			if i == 0 && len(ws) > 0 {
				close(ws[0].turn)
			}
			break
		}
	}
	if len(ws) == 0 {
		delete(q.queues, resource)
	} else {
		q.queues[resource] = ws
	}
}

// released wakes the first waiter of resource, if any.
func (q *waitQueues) released(resource string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ws := q.queues[resource]; len(ws) > 0 {
		select {
		case ws[0].wake <- struct{}{}:
		default:
		}
	}
}
