package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// testBumpDuringBlockedAcquisition forces the schedule in which an acquisition overlaps an
// epoch bump: the acquisition starts before the bump and waits on the resource's row, which
// another session holds locked; the bump is sent while it waits; then the lock is released.
// On an engine that reads the store's epoch when the acquisition's statement starts and never
// again, the bump commits meanwhile and the acquisition then commits a lease with the epoch
// from before it, which a publication sent after the bump was acknowledged would present.
//
// Whatever order the engine settles the two in, afterwards an acquisition answered after the
// bump must carry the bump's epoch (or be refused), and no token with an older epoch may renew
// or publish: neither the acquisition's nor that of a lease held before the bump.
func testBumpDuringBlockedAcquisition(t *testing.T, e *env) {
	if e.HoldRowLock == nil {
		if e.NoRowLock == "" {
			t.Fatal("the target sets neither HoldRowLock nor NoRowLock: say why no statement can wait on a row lock")
		}
		t.Skip("no row lock to wait on: " + e.NoRowLock)
	}
	const resource, held = "bump ⚡ race", "bump held é"
	s := e.store(t) // migrates
	provision(t, s, resource, held)
	c := ctx(t)
	open := func() driver.Driver {
		d := e.Open(t)
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	drv, acquirer, bumper := open(), open(), open()
	// A first bump, so that epoch and generation differ.
	if _, err := drv.BumpEpoch(c); err != nil {
		t.Fatal(err)
	}
	g, err := drv.Acquire(c, held, "before ü", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	before := driver.LeaseRef{Resource: held, Owner: "before ü", Epoch: g.Epoch, Generation: g.Generation}

	lock, err := e.HoldRowLock(c, resource, LockOnly)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			_ = lock.Release(context.Background())
		}
	})
	type acquisition struct {
		g   driver.Grant
		err error
	}
	acquired := make(chan acquisition, 1)
	go func() {
		g, err := acquirer.Acquire(c, resource, "during ü", time.Minute)
		acquired <- acquisition{g, err}
	}()
	waitFor := func(n int, what string) {
		t.Helper()
		for {
			if got, err := lock.Waiting(c); err != nil {
				t.Fatal(err)
			} else if got >= n {
				return
			}
			select {
			case a := <-acquired:
				t.Fatalf("the acquisition finished while the row was locked: %+v, %v", a.g, a.err)
			case <-c.Done():
				t.Fatal("never seen: " + what)
			case <-time.After(150 * time.Millisecond):
			}
		}
	}
	waitFor(1, "the acquisition waiting on the row lock")

	type bump struct {
		epoch int64
		err   error
	}
	bumped := make(chan bump, 1)
	go func() {
		epoch, err := bumper.BumpEpoch(c)
		bumped <- bump{epoch, err}
	}()
	// Either the bump commits while the acquisition waits (the schedule of the bug), or the
	// engine makes it wait for the acquisition: the bump is then seen waiting behind it.
	var b bump
	bumpFirst := false
	for !bumpFirst {
		select {
		case b = <-bumped:
			bumpFirst = true
			continue
		case a := <-acquired:
			t.Fatalf("the acquisition finished while the row was locked: %+v, %v", a.g, a.err)
		case <-c.Done():
			t.Fatal("the bump neither finished nor waited behind the acquisition")
		case <-time.After(150 * time.Millisecond):
		}
		n, err := lock.Waiting(c)
		if err != nil {
			t.Fatal(err)
		}
		if n >= 2 {
			break
		}
	}
	released = true
	if err := lock.Release(c); err != nil {
		t.Fatal(err)
	}
	a := <-acquired
	if !bumpFirst {
		b = <-bumped
	}
	if b.err != nil {
		t.Fatalf("bump: %v", b.err)
	}
	var busy *driver.BusyError
	switch {
	case a.err == nil:
		t.Logf("bump committed first: %v; acquisition got epoch %d, generation %d; the bump's epoch %d",
			bumpFirst, a.g.Epoch, a.g.Generation, b.epoch)
		if bumpFirst && a.g.Epoch != b.epoch {
			t.Errorf("the acquisition answered after the bump (epoch %d) carries epoch %d", b.epoch, a.g.Epoch)
		}
		if a.g.Epoch != b.epoch {
			ref := driver.LeaseRef{Resource: resource, Owner: "during ü", Epoch: a.g.Epoch, Generation: a.g.Generation}
			// The bump freed every lease: one it could not see is free too, to a reader and
			// to the next acquisition.
			if st, err := drv.Read(c, resource); err != nil || st.Owner != "" {
				t.Errorf("after the bump, the lease of the acquisition it did not see is still shown: owner %q, %v", st.Owner, err)
			}
			checkFenced(t, c, drv, "the acquisition that overlapped the bump", "bump-race-overlap", ref)
			if g, err := drv.Acquire(c, resource, "after ü", time.Minute); err != nil || g.Epoch != b.epoch {
				t.Errorf("acquisition after the bump: %+v, %v; want epoch %d", g, err, b.epoch)
			}
		}
	case errors.As(a.err, &busy):
		t.Logf("acquisition refused: %v", a.err)
	default:
		t.Fatalf("acquisition: %v", a.err)
	}
	checkFenced(t, c, drv, "the lease held before the bump", "bump-race-held", before)
}

// checkFenced: a renewal and a publication with ref, whose epoch a bump has superseded, are
// both refused.
func checkFenced(t *testing.T, c context.Context, drv driver.Driver, what, op string, ref driver.LeaseRef) {
	t.Helper()
	if _, ok, err := drv.Renew(c, ref, time.Hour); err != nil || ok {
		t.Errorf("renewal with %s's token (epoch %d): ok=%v, err=%v; want a refusal", what, ref.Epoch, ok, err)
	}
	if ok, err := drv.Publish(c, ref, driver.Publication{Payload: []byte("stale\x00epoch"), OpID: op}); err != nil || ok {
		t.Errorf("publication with %s's token (epoch %d): ok=%v, err=%v; want a refusal", what, ref.Epoch, ok, err)
	}
}
