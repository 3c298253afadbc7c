package drivertest

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// lossResource is a resource name with a space and non-ASCII letters, so that no test passes
// only because names are plain.
const lossResource = "report für Q3"

// testEpochFromClock: a new store's epoch is the engine's clock in microseconds since 1970 at
// its creation, so that the first tokens are not (1, 1) and epoch and generation differ.
func testEpochFromClock(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, lossResource)
	st := show(t, s, lossResource)
	// Created moments ago by the engine's clock; a millisecond of slack for SQLite, whose
	// reported clock has millisecond resolution.
	if now := st.Now.UnixMicro(); st.CurrentEpoch <= st.Now.Add(-time.Hour).UnixMicro() || st.CurrentEpoch > now+1000 {
		t.Fatalf("a new store's epoch is %d; want the engine's clock at its creation, in microseconds (now %d)", st.CurrentEpoch, now)
	}
	l := acquire(t, s, lossResource, time.Minute)
	if l.Epoch() != st.CurrentEpoch || l.Generation() != 1 {
		t.Fatalf("first token %s, want (%d, 1)", l.Token(), st.CurrentEpoch)
	}
}

// testSmallEpoch: a store created before epochs came from the clock holds a small epoch. It
// keeps working, and its next bump jumps to the clock.
func testSmallEpoch(t *testing.T, e *env) {
	if e.SetEpoch == nil {
		t.Skip("!!! the target cannot set a small epoch (Target.SetEpoch): a store migrated from small epochs is not tested")
	}
	s := e.store(t)
	provision(t, s, lossResource, "idle")
	if err := e.SetEpoch(ctx(t), 3); err != nil {
		t.Fatalf("set epoch: %v", err)
	}
	old := acquire(t, s, lossResource, time.Minute)
	if old.Token() != (fenced.Token{Epoch: 3, Generation: 1}) {
		t.Fatalf("token at a small epoch: %s, want 3.1", old.Token())
	}
	if err := old.Publish(ctx(t), []byte("at epoch 3\x00")); err != nil {
		t.Fatalf("publish at a small epoch: %v", err)
	}
	clock := show(t, s, "idle").Now.UnixMicro()
	epoch, err := s.BumpEpoch(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if epoch < clock {
		t.Fatalf("a bump from epoch 3 gave %d, want at least the engine's clock %d", epoch, clock)
	}
	wantRefused(t, old.Release(ctx(t)), fenced.CauseEpochBumped)
	l := acquire(t, s, lossResource, time.Minute)
	if l.Token() != (fenced.Token{Epoch: epoch, Generation: 2}) {
		t.Fatalf("token after the bump: %s, want %d.2", l.Token(), epoch)
	}
	if err := l.PublishAndRelease(ctx(t), []byte("after")); err != nil {
		t.Fatal(err)
	}
}

// loseEverything destroys the store, or skips loudly when the target cannot.
func (e *env) loseEverything(t *testing.T) {
	t.Helper()
	if e.LoseEverything == nil {
		why := e.NoLoseEverything
		if why == "" {
			why = "Target.LoseEverything is not set"
		}
		t.Skipf("!!! a total loss of the store is not tested: %s", why)
	}
	if err := e.LoseEverything(ctx(t)); err != nil {
		t.Fatalf("lose everything: %v", err)
	}
}

// afterLoss opens a store where the lost one was, checks that it is empty, provisions the
// resource and acquires it: the token must be greater than before, which is issued last before
// the loss. A lease of the lost store is refused by the new one.
func (e *env) afterLoss(t *testing.T, lost *fenced.Lease) {
	t.Helper()
	s := e.store(t)
	if _, err := s.Show(ctx(t), lossResource); !errors.Is(err, fenced.ErrNotProvisioned) {
		t.Fatalf("after losing everything the resource is still there (%v): the target did not lose the store", err)
	}
	provision(t, s, lossResource)
	l := acquire(t, s, lossResource, time.Minute)
	if l.Token().Compare(lost.Token()) <= 0 {
		t.Fatalf("after a total loss the store issued %s, not greater than %s issued before it", l.Token(), lost.Token())
	}
	ghost, err := s.LeaseFor(lossResource, lost.Owner(), lost.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := ghost.Publish(ctx(t), []byte("from before the loss")); !errors.Is(err, fenced.ErrRefused) {
		t.Fatalf("a lease from before the loss publishing: %v, want refused", err)
	}
	if err := l.Publish(ctx(t), []byte("after the loss\x00")); err != nil {
		t.Fatalf("publish after the loss: %v", err)
	}
}

// testTotalLoss: the store is lost entirely and created again, as a restart without
// persistence, a deleted file or a re-initialised cluster would; no operator bumps anything.
// The first token of the new store must still be greater than the last of the old one.
func testTotalLoss(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, lossResource)
	var last *fenced.Lease
	for range 3 {
		last = acquire(t, s, lossResource, time.Minute)
		if err := last.PublishAndRelease(ctx(t), []byte("before the loss")); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.Close() // its process is gone with the store
	e.loseEverything(t)
	e.afterLoss(t, last)
}

// testTotalLossAfterBump: epochs set by bumps (several in a row, faster than any clock tick a
// coarse clock would show) are still below the epoch of a store created after a total loss.
func testTotalLossAfterBump(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, lossResource)
	var last *fenced.Lease
	for range 3 {
		if _, err := s.BumpEpoch(ctx(t)); err != nil {
			t.Fatal(err)
		}
		last = acquire(t, s, lossResource, time.Minute)
	}
	_ = s.Close()
	e.loseEverything(t)
	e.afterLoss(t, last)
}
