package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// RowLockMode is how the session of Target.HoldRowLock holds a resource's row.
type RowLockMode int

const (
	// LockOnly locks the row without changing it (SELECT ... FOR UPDATE) and then commits.
	LockOnly RowLockMode = iota
	// UpdateThenRollback changes the row and then rolls the change back, as a publication that
	// lost a race does.
	UpdateThenRollback
)

func (m RowLockMode) String() string {
	if m == UpdateThenRollback {
		return "UpdateThenRollback"
	}
	return "LockOnly"
}

// RowLock is a lock on one resource's row held by a session of the target's own.
type RowLock struct {
	// Waiting returns how many sessions the engine reports as waiting for this lock.
	Waiting func(ctx context.Context) (int, error)
	// Release ends the holder's transaction: a commit for LockOnly, a rollback for
	// UpdateThenRollback.
	Release func(ctx context.Context) error
}

// rowLockTTL is the lease's TTL in testRowLockAcrossExpiry: long enough for both statements to
// be seen waiting before the lease expires, which the test checks on the database's clock.
const rowLockTTL = 3 * time.Second

// testRowLockAcrossExpiry: a renewal and a publication that start while the lease is live but
// wait on the row lock of another session until after it has expired must both be refused.
// An engine that reads its clock when the statement starts (MySQL's UTC_TIMESTAMP) or that
// keeps the condition it evaluated before the wait (PostgreSQL, unless the holder updated the
// row and committed) would accept them: a revived lease and a publication after expiry.
func testRowLockAcrossExpiry(t *testing.T, e *env) {
	if e.HoldRowLock == nil {
		if e.NoRowLock == "" {
			t.Fatal("the target sets neither HoldRowLock nor NoRowLock: say why no statement can wait on a row lock")
		}
		t.Skip("no row lock to wait on: " + e.NoRowLock)
	}
	for _, mode := range []RowLockMode{LockOnly, UpdateThenRollback} {
		t.Run(mode.String(), func(t *testing.T) { rowLockAcrossExpiry(t, e, mode) })
	}
}

func rowLockAcrossExpiry(t *testing.T, e *env, mode RowLockMode) {
	resource := "row lock ⏳ " + mode.String()
	s := e.store(t) // migrates
	provision(t, s, resource)
	c := ctx(t)
	drv := e.Open(t)
	t.Cleanup(func() { _ = drv.Close() })
	// Epoch 2, generation 2: no check passes because the two happen to coincide.
	if _, err := drv.BumpEpoch(c); err != nil {
		t.Fatal(err)
	}
	g, err := drv.Acquire(c, resource, "first", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := drv.Release(c, driver.LeaseRef{Resource: resource, Owner: "first", Epoch: g.Epoch, Generation: g.Generation}); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	if _, err := drv.BumpEpoch(c); err != nil {
		t.Fatal(err)
	}
	g, err = drv.Acquire(c, resource, "holder ü", rowLockTTL)
	if err != nil {
		t.Fatal(err)
	}
	ref := driver.LeaseRef{Resource: resource, Owner: "holder ü", Epoch: g.Epoch, Generation: g.Generation}
	before, err := drv.Read(c, resource)
	if err != nil {
		t.Fatal(err)
	}

	lock, err := e.HoldRowLock(c, resource, mode)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			_ = lock.Release(context.Background())
		}
	})

	type result struct {
		op  string
		ok  bool
		err error
	}
	results := make(chan result, 2)
	go func() {
		_, ok, err := drv.Renew(c, ref, time.Hour)
		results <- result{"renewal", ok, err}
	}()
	go func() {
		ok, err := drv.Publish(c, ref, driver.Publication{Payload: []byte("late\x00payload"), OpID: "row-lock-" + mode.String()})
		results <- result{"publication", ok, err}
	}()

	// The engine, not a sleep, says when both statements wait on the lock. MariaDB refreshes
	// INNODB_TRX only when it was not read for 100 ms, so the poll is slower than that.
	for n := 0; n < 2; {
		select {
		case r := <-results:
			t.Fatalf("the %s finished while the row was locked: ok=%v err=%v", r.op, r.ok, r.err)
		case <-c.Done():
			t.Fatal("the renewal and the publication were never both seen waiting on the row lock")
		case <-time.After(150 * time.Millisecond):
		}
		if n, err = lock.Waiting(c); err != nil {
			t.Fatal(err)
		}
	}
	// Both started while the lease was live, or the schedule under test did not happen.
	st, err := drv.Read(c, resource)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Now.Before(g.LeaseUntil) {
		t.Fatalf("the lease expired (at %s) before both statements were seen waiting (at %s): the TTL is too short for this machine",
			g.LeaseUntil, st.Now)
	}
	// Wait out the expiry on the database's clock; reading the row does not wait on its lock.
	for !st.Now.After(g.LeaseUntil) {
		select {
		case r := <-results:
			t.Fatalf("the %s finished while the row was locked: ok=%v err=%v", r.op, r.ok, r.err)
		case <-c.Done():
			t.Fatal("the lease never expired on the database's clock")
		case <-time.After(50 * time.Millisecond):
		}
		if st, err = drv.Read(c, resource); err != nil {
			t.Fatal(err)
		}
	}
	released = true
	if err := lock.Release(c); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("the %s after waiting on the lock: %v", r.op, r.err)
		}
		if r.ok {
			t.Errorf("the %s that waited on the row lock (%s) until after the lease expired was accepted, want a refusal",
				r.op, mode)
		}
	}
	after, err := drv.Read(c, resource)
	if err != nil {
		t.Fatal(err)
	}
	if !after.LeaseUntil.Equal(before.LeaseUntil) || after.PublishedGeneration != before.PublishedGeneration {
		t.Errorf("the row changed: before %s, after %s", describe(before), describe(after))
	}
	if p, _, err := drv.ReadPayload(c, resource); err != nil || bytes.Contains(p, []byte("late")) {
		t.Errorf("payload after the refused publication: %q, %v", p, err)
	}
	if op, err := drv.ReadOperation(c, "row-lock-"+mode.String()); err != nil || op.Outcome == driver.OutcomeAccepted {
		t.Errorf("the refused publication's operation: %+v, %v", op, err)
	}
	if errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatal("ran out of time")
	}
}

func describe(s driver.State) string {
	return fmt.Sprintf("lease until %s, published generation %d", s.LeaseUntil.Format(time.RFC3339Nano), s.PublishedGeneration)
}
