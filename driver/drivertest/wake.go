package drivertest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// observed wraps a waiter's driver and reports when AcquireWait goes to sleep: after a busy
// Acquire, AcquireWait reads the resource to time its retry and then sleeps, so the first Read
// that follows a busy answer marks the start of the sleep (a release after it can only be
// heard by the signal subscribed before the first attempt, or seen by a later poll). It hides
// the driver's optional interfaces; notifying adds ReleaseNotifier back.
type observed struct {
	driver.Driver
	busy   atomic.Bool
	asleep chan struct{}
}

func (o *observed) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	g, err := o.Driver.Acquire(ctx, resource, owner, ttl)
	if _, busy := errors.AsType[*driver.BusyError](err); busy {
		o.busy.Store(true)
	}
	return g, err
}

func (o *observed) Read(ctx context.Context, resource string) (driver.State, error) {
	st, err := o.Driver.Read(ctx, resource)
	if o.busy.Swap(false) {
		select {
		case o.asleep <- struct{}{}:
		default:
		}
	}
	return st, err
}

type notifying struct {
	*observed
	n driver.ReleaseNotifier
}

func (n notifying) NotifyReleased(ctx context.Context, resource string) (<-chan struct{}, func(), error) {
	return n.n.NotifyReleased(ctx, resource)
}

// waiterStore opens a store on a driver of its own (another process, as far as the database
// can tell) whose polling would outlast any test: only a signal or the holder's lease running
// out by the database's clock can make it retry. signal false hides the driver's
// ReleaseNotifier.
func (e *env) waiterStore(t *testing.T, signal bool) (*fenced.Store, *observed) {
	t.Helper()
	drv := e.Open(t)
	n, ok := drv.(driver.ReleaseNotifier)
	if signal && !ok {
		_ = drv.Close()
		t.Skipf("%T signals no freed lease (no driver.ReleaseNotifier); its waiters poll", drv)
	}
	o := &observed{Driver: drv, asleep: make(chan struct{}, 1)}
	var wrapped driver.Driver = o
	if signal {
		wrapped = notifying{o, n}
	}
	s, err := fenced.New(ctx(t), wrapped, e.config(&fenced.Config{WaitPollMin: time.Hour, WaitPollMax: time.Hour}))
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, o
}

// testWokenBySignal: a waiter blocked on a resource held through another store is woken by the
// engine's signal when the lease is released, published and released, or freed by an epoch
// bump. The waiter's polling interval is an hour and the holder's lease lasts an hour, so
// within the test's deadline only the signal can wake it; the same schedule without the
// signal (the driver's ReleaseNotifier hidden) leaves the waiter asleep, which shows that the
// deadline is too short for anything else.
func testWokenBySignal(t *testing.T, e *env) {
	const resource = "woken by signal ü"
	waiters, wo := e.waiterStore(t, true)
	silent, so := e.waiterStore(t, false)
	holders := e.store(t)
	provision(t, holders, resource)
	if _, err := holders.BumpEpoch(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for _, free := range []string{"release", "publish and release", "epoch bump", "no signal"} {
		holder := acquire(t, holders, resource, time.Hour)
		s, o, deadline := waiters, wo, 30*time.Second
		if free == "no signal" {
			s, o, deadline = silent, so, 2*time.Second
		}
		wctx, cancel := context.WithTimeout(ctx(t), deadline)
		type result struct {
			l   *fenced.Lease
			err error
		}
		done := make(chan result, 1)
		go func() {
			l, err := s.AcquireWait(wctx, resource, time.Minute)
			done <- result{l, err}
		}()
		<-o.asleep // busy, and asleep for half an hour at least
		var err error
		switch free {
		case "publish and release":
			err = holder.PublishAndRelease(ctx(t), []byte("done\x00"))
		case "epoch bump":
			_, err = holders.BumpEpoch(ctx(t))
		default:
			err = holder.Release(ctx(t))
		}
		if err != nil {
			t.Fatalf("%s: %v", free, err)
		}
		r := <-done
		cancel()
		if free == "no signal" {
			if !errors.Is(r.err, fenced.ErrBusy) || !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("without the signal the waiter got %v, %v within %s: the test's deadline does not exclude polling", r.l, r.err, deadline)
			}
			continue
		}
		if r.err != nil {
			t.Fatalf("after %s, the waiter (polling hourly) was not woken within %s: %v", free, deadline, r.err)
		}
		if r.l.Token().Compare(holder.Token()) <= 0 {
			t.Fatalf("after %s the waiter got %s, not after %s", free, r.l.Token(), holder.Token())
		}
		if err := r.l.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// testWaiterRetriesAtExpiry: a waiter whose polling interval is an hour still gets the lease
// soon after the holder's lease runs out without a release: it times its retry from the
// resource's expiry and the database's now (or, on etcd, the deletion of the expired key
// wakes it).
func testWaiterRetriesAtExpiry(t *testing.T, e *env) {
	const resource = "expires under a waiter ü"
	waiters, o := e.waiterStore(t, false)
	holders := e.store(t)
	provision(t, holders, resource)
	if _, err := holders.BumpEpoch(ctx(t)); err != nil {
		t.Fatal(err)
	}
	holder := acquire(t, holders, resource, 2*time.Second)
	wctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
	defer cancel()
	l, err := waiters.AcquireWait(wctx, resource, time.Minute)
	if err != nil {
		t.Fatalf("the holder's 2 s lease ran out, but the waiter (polling hourly) did not get it: %v", err)
	}
	select {
	case <-o.asleep:
	default:
		t.Fatal("the waiter never found the resource busy: nothing was tested")
	}
	if l.Token().Compare(holder.Token()) <= 0 {
		t.Fatalf("the waiter got %s, not after the holder's %s", l.Token(), holder.Token())
	}
	wantRefused(t, holder.Publish(ctx(t), []byte("late\x00")), fenced.CauseSuperseded)
}
