package fenced

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/trustclock"
)

// Default polling bounds of AcquireWait (Config.WaitPollMin and WaitPollMax).
const (
	DefaultWaitPollMin = 5 * time.Millisecond
	DefaultWaitPollMax = time.Second
)

// AcquireWait is Acquire that waits while the resource is busy: it returns the lease once an
// acquisition is granted, or the first error other than busy, or, when ctx ends first, an
// error matching both ErrBusy and ctx's error, whose outcome is certain: no acquisition. Its
// *BusyError is the waiter's last busy answer, or, when ctx ended while the waiter was still
// queued behind an earlier one of this Store (so that it sent nothing), the last busy answer
// that earlier waiter had; it names only the resource, with generation 0, when no answer was
// known, and the error's text then says that nothing was sent. ctx ends the waiting
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
// (drivertest's WaiterWokenBySignal and WaiterRetriesAtExpiry). Where the driver waits itself
// (driver.Waiter: the remote driver, whose service queues its waiters), the wait is sent to it
// instead of polling: see acquireWaitInEngine. OnWaiting is then called only when such a wait
// ends busy and another is sent, or when the waiter queues behind an earlier one.
func (s *Store) AcquireWait(ctx context.Context, resource string, ttl time.Duration, opts ...WaitOption) (*Lease, error) {
	if err := validResource(resource); err != nil {
		return nil, err
	}
	if _, err := s.margin(ttl); err != nil {
		return nil, err
	}
	o := waitOptions{start: time.Now()}
	for _, opt := range opts {
		opt(&o)
	}
	if o.owner == "" {
		o.owner = newID()
	} else if err := ValidateOwner(o.owner); err != nil {
		return nil, err
	}
	w := s.waits.join(resource)
	defer s.waits.leave(resource, w)
	select {
	case <-w.turn:
	default:
		o.queued = true
		o.waiting() // queued behind an earlier waiter
		select {
		case <-w.turn:
		case <-ctx.Done():
			return nil, gaveUpUnsent(s.waits.aheadBusy(resource, w), resource, &o, ctx.Err())
		}
	}
	// The attempts run in a function of their own: its frame is large, and a waiter queued
	// behind others (thousands of them, in a service) then waits on a small stack.
	return s.acquireWaitTurn(ctx, resource, ttl, w, &o)
}

// gaveUpUnsent ends the wait of a waiter that ctx ended before it sent an attempt: busy with
// what the waiter ahead of it last heard (ahead, nil when nothing is known). Nothing was sent,
// so the outcome is certain: no acquisition.
func gaveUpUnsent(ahead *BusyError, resource string, o *waitOptions, ctxErr error) error {
	if ahead == nil {
		ahead = &BusyError{Resource: resource}
	}
	note := "the wait ended before its first attempt was sent"
	if o.queued {
		note = "it was queued behind an earlier waiter and sent no attempt"
	}
	return &gaveUpError{busy: ahead, waited: time.Since(o.start), ctxErr: ctxErr, note: note}
}

// acquireWaitTurn is AcquireWait once the waiter is the first of its resource.
func (s *Store) acquireWaitTurn(ctx context.Context, resource string, ttl time.Duration, w *waiter, o *waitOptions) (*Lease, error) {
	if wt, ok := s.drv.(driver.Waiter); ok {
		return s.acquireWaitInEngine(ctx, resource, ttl, wt, w, o)
	}
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
		return nil, gaveUpUnsent(nil, resource, o, err)
	}
	for {
		// ctx bounds the waiting, not an attempt: one that has been sent finishes (for at most
		// Config.ReleaseTimeout), so that the end of a wait makes no outcome unknown.
		// The read that times the retry is detached too: a statement cut short by ctx is not
		// needed, and cancelling one can disturb the connection it ran on.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attemptTimeout)
		l, err := s.acquireAs(actx, resource, o.owner, ttl)
		var busy *BusyError
		if !errors.As(err, &busy) {
			cancel()
			return l, err
		}
		s.waits.heard(w, busy)
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
			return nil, gaveUp(busy, o.start, ctx.Err())
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
	start     time.Time // when AcquireWait was called
	queued    bool      // it had to wait behind an earlier waiter of the Store
	onWaiting func()
	owner     string
}

// AsOwner makes every attempt of AcquireWait install owner (1 to 128 bytes of UTF-8 without
// control characters) instead of a fresh random identity, so that a caller whose reply is
// lost can recognise its own acquisition in the row (Store.Show) and release it. The service
// uses it for a waiting request that names its owner.
func AsOwner(owner string) WaitOption { return func(o *waitOptions) { o.owner = owner } }

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
	busy *BusyError    // the last busy answer it had, under waitQueues.mu
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

// heard records w's latest busy answer, for the waiters queued behind it.
func (q *waitQueues) heard(w *waiter, busy *BusyError) {
	q.mu.Lock()
	w.busy = busy
	q.mu.Unlock()
}

// aheadBusy is the last busy answer of the waiter at the front of resource's queue, when that
// is not w, or nil.
func (q *waitQueues) aheadBusy(resource string, w *waiter) *BusyError {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ws := q.queues[resource]; len(ws) > 0 && ws[0] != w && ws[0].busy != nil {
		b := *ws[0].busy // a copy: the error it goes into is the caller's
		return &b
	}
	return nil
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

// maxEngineWait is the wait asked of a driver.Waiter when ctx has no deadline; the driver
// caps it at its engine's limit, and AcquireWait asks again while ctx allows.
const maxEngineWait = 24 * time.Hour

// acquireWaitInEngine is acquireWaitTurn for a driver that waits itself (driver.Waiter: a
// fenced service). Each call asks the engine to wait until ctx's deadline (at most the
// engine's limit) and is repeated while ctx allows, so the waiter does not give up before its
// own deadline: the engine's answer comes at or after it. A repeated call queues again in the
// engine, behind the waiters that arrived meanwhile (docs/SERVICE.md, Waiting). The request runs past that deadline
// by at most Config.ReleaseTimeout, so that a grant at the deadline is returned rather than
// made unknown; a cancellation of ctx (not its deadline) ends the request at once, and the
// engine, seeing its client gone, leaves its queue and releases a lease granted too late.
//
// Every call installs the same owner. After an unknown outcome (a lost reply, a cancelled
// request), the row is read once: a lease held by that owner is released, so that it does not
// stay held by nobody for its whole TTL, and the error still reports the outcome unknown.
//
// A lease granted after a wait longer than the safety margin is renewed once at once: its
// trust window is timed from the moment a request was sent, and the wait's request was sent
// before the grant, perhaps longer ago than the TTL.
func (s *Store) acquireWaitInEngine(ctx context.Context, resource string, ttl time.Duration, wt driver.Waiter, w *waiter, o *waitOptions) (*Lease, error) {
	margin, err := s.margin(ttl)
	if err != nil {
		return nil, err
	}
	var busy *BusyError
	for {
		if err := ctx.Err(); err != nil {
			if busy == nil {
				return nil, gaveUpUnsent(nil, resource, o, err)
			}
			return nil, gaveUp(busy, o.start, err)
		}
		wait := maxEngineWait
		if dl, ok := ctx.Deadline(); ok {
			wait = max(time.Until(dl), time.Millisecond)
		}
		// Detached from ctx's deadline, not from its cancellation.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+s.cfg.ReleaseTimeout)
		stop := context.AfterFunc(ctx, func() {
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				cancel()
			}
		})
		sent := trustclock.Now()
		if s.waits.hook != nil {
			s.waits.hook("engine-wait", wait)
		}
		g, err := wt.AcquireWait(actx, resource, o.owner, ttl, wait)
		stop()
		cancel()
		var dbusy *driver.BusyError
		switch {
		case err == nil:
			return s.waitedLease(ctx, driver.LeaseRef{Resource: resource, Owner: o.owner, Epoch: g.Epoch, Generation: g.Generation},
				g.LeaseUntil, sent, ttl, margin)
		case errors.As(err, &dbusy):
			busy = &BusyError{Resource: resource, Token: Token{Epoch: dbusy.Epoch, Generation: dbusy.Generation},
				Generation: dbusy.Generation, LeaseUntil: dbusy.LeaseUntil}
			s.waits.heard(w, busy)
			o.waiting()
		case errors.Is(err, driver.ErrNotFound):
			return nil, fmt.Errorf("acquire %q: %w", resource, ErrNotProvisioned)
		case errors.Is(err, driver.ErrIncarnationChanged):
			return nil, incarnationError(opAcquire, resource, err)
		default:
			merr := mutationError(opAcquire, resource, err, func(e *OutcomeUnknownError) { e.Owner = o.owner })
			if errors.Is(merr, ErrOutcomeUnknown) {
				s.settleWait(resource, o.owner)
			}
			return nil, merr
		}
	}
}

// waitedLease is the lease granted to a wait whose request was sent at sent (trustclock).
func (s *Store) waitedLease(ctx context.Context, ref driver.LeaseRef, leaseUntil time.Time, sent, ttl, margin time.Duration) (*Lease, error) {
	if trustclock.Now()-sent > margin {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReleaseTimeout)
		defer cancel()
		renewSent := trustclock.Now()
		until, ok, err := s.drv.Renew(rctx, ref, ttl)
		switch {
		case err == nil && ok:
			leaseUntil, sent = until, renewSent
		case err == nil:
			// Not current any more (an epoch bump, or the TTL ran out): it was lost.
			return nil, fmt.Errorf("acquire %q: granted after waiting, then lost before it could be renewed: %w",
				ref.Resource, s.refusal(rctx, opRenew, ref, nil))
		}
		// Unknown: the lease keeps the window of the wait's request, which may have ended.
	}
	return newLease(s, ref, leaseUntil, sent+ttl-margin), nil
}

// settleWait releases resource's lease if owner holds it: after a waiting acquisition's
// unknown outcome, so that a grant whose reply was lost does not stay held by nobody.
func (s *Store) settleWait(resource, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ReleaseTimeout)
	defer cancel()
	st, err := s.drv.Read(ctx, resource)
	if err != nil || st.Owner != owner {
		return
	}
	ref := driver.LeaseRef{Resource: resource, Owner: owner, Epoch: st.Epoch, Generation: st.Generation}
	if ok, err := s.drv.Release(ctx, ref); err == nil && ok {
		s.waits.released(resource)
		if s.waits.hook != nil {
			s.waits.hook("settled", 0)
		}
	}
}

// releasedAll wakes the first waiter of every resource (an epoch bump freed every lease).
func (q *waitQueues) releasedAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ws := range q.queues {
		select {
		case ws[0].wake <- struct{}{}:
		default:
		}
	}
}

// gaveUpError ends a wait that ctx cut short while the lease was still held: busy, with how
// long the caller waited. It matches ErrBusy (and the *BusyError, with errors.As) and ctx's error.
// A *BusyError of generation 0 names no holder: none was known.
type gaveUpError struct {
	busy   *BusyError
	waited time.Duration
	ctxErr error
	note   string // why nothing was sent, when nothing was
}

func gaveUp(busy *BusyError, start time.Time, ctxErr error) error {
	return &gaveUpError{busy: busy, waited: time.Since(start), ctxErr: ctxErr}
}

func (e *gaveUpError) Error() string {
	waited := e.waited.Round(time.Millisecond)
	if e.waited >= time.Second {
		waited = e.waited.Round(100 * time.Millisecond)
	}
	if e.busy.Generation == 0 { // no holder known
		why := e.note
		if why == "" {
			why = "the resource is still busy (its holder was not reported)"
		}
		return fmt.Sprintf("gave up waiting for %q after %s: %s", e.busy.Resource, waited, why)
	}
	held := Token{Epoch: e.busy.Token.Epoch, Generation: e.busy.Generation}
	msg := fmt.Sprintf("gave up waiting for %q after %s: %s is still held, until %s by the database's clock",
		e.busy.Resource, waited, held.lease(), e.busy.LeaseUntil.UTC().Format(time.RFC3339Nano))
	if e.note != "" {
		msg += "; " + e.note
	}
	return msg
}

func (e *gaveUpError) Unwrap() []error { return []error{e.busy, e.ctxErr} }
