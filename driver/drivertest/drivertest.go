// Package drivertest is the conformance suite that every fenced backend must pass.
//
// A backend's tests call Run with a Target that opens independent connections to a store no
// other test uses. Each worker in a test gets its own connection, and every ordering the suite
// depends on is forced with channels, never with sleeps that hope for a collision.
package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Target is one isolated store of the backend under test.
type Target struct {
	// Open returns a driver on new connections of its own to the store. The suite closes it.
	Open func(t *testing.T) driver.Driver

	// Expire moves the resource's lease expiry into the past on the database's own clock, as
	// an operator could in an isolated test database. It stands in for waiting out a TTL.
	Expire func(ctx context.Context, resource string) error

	// LostReply returns a driver on connections of its own to the store whose next reply, once
	// arm has been called, is lost after the engine carried out the request. Network backends
	// route a real connection through a Proxy, so that the driver's own error classification is
	// what is tested; an embedded engine wraps its driver with LoseReplies. Required.
	LostReply func(t *testing.T) (drv driver.Driver, arm func())

	// Unreachable returns a driver for this backend whose requests can never reach a server
	// (pointed at ClosedAddr). Nil for an embedded engine.
	Unreachable func(t *testing.T) driver.Driver

	// LoseEverything destroys the store as a total loss would (the file deleted, the schema
	// or database dropped, the keys flushed, a new cluster), so that the next Open starts a
	// new, empty store in the same place. Drivers opened before it are not used afterwards.
	// Nil only when the backend cannot do it; NoLoseEverything then says why, and the tests
	// that need it skip loudly.
	LoseEverything   func(ctx context.Context) error
	NoLoseEverything string

	// SetEpoch overwrites the store's epoch with a small value, as a store created before
	// epochs came from the clock holds it, to show that such a store keeps working. Nil skips
	// that test loudly.
	SetEpoch func(ctx context.Context, epoch int64) error

	// AllowNonDurable opens the suite's stores with fenced.Config.AllowNonDurable, for a test
	// server that runs without durable settings (this machine's Redis has no append-only file).
	AllowNonDurable bool

	// HoldRowLock makes a session of the target's own hold resource's row lock, in mode, and
	// returns once it holds it; the renewal and the publication of RowLockAcrossExpiry then wait
	// for it. Nil for an engine where no statement waits on another session's lock while the
	// lease expires; NoRowLock then says why.
	HoldRowLock func(ctx context.Context, resource string, mode RowLockMode) (RowLock, error)
	NoRowLock   string
}

// NewTarget returns a Target for one test; the backend creates a fresh schema, database or
// file for it and removes it in t.Cleanup.
type NewTarget func(t *testing.T) Target

// Run runs the whole suite.
func Run(t *testing.T, newTarget NewTarget) {
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"Handover", testHandover},
		{"HandoverThroughRun", testHandoverThroughRun},
		{"StaleReleaseAfterSuccessor", testStaleRelease},
		{"PublishAfterExpiryWithoutSuccessor", testPublishAfterExpiry},
		{"SecondPublicationRefused", testSecondPublication},
		{"RenewRefusedAfterSupersession", testRenewAfterSupersession},
		{"RenewRefusedAfterExpiry", testRenewAfterExpiry},
		{"RenewExtends", testRenewExtends},
		{"RowLockAcrossExpiry", testRowLockAcrossExpiry},
		{"BumpDuringBlockedAcquisition", testBumpDuringBlockedAcquisition},
		{"OverlappingAcquisitions", testOverlappingAcquisitions},
		{"GenerationsSurviveReleaseAndReopen", testGenerationsSurvive},
		{"BadInputChangesNothing", testBadInput},
		{"BusyAndNotProvisioned", testBusyAndNotProvisioned},
		{"ProvisionNeverResets", testProvisionIdempotent},
		{"DatabaseErrorIsNotBusy", testDatabaseErrorIsNotBusy},
		{"PayloadRoundTrip", testPayloadRoundTrip},
		{"PublishAndRelease", testPublishAndRelease},
		{"RunPublishesAndReleases", testRunPublishes},
		{"RunBuildErrorPublishesNothing", testRunBuildError},
		{"RunTrustWindowEndsBuild", testRunTrustWindow},
		{"RunRenewsPastTTL", testRunRenews},
		{"RunRenewalRefusedEndsBuild", testRunRenewalRefused},
		{"LostReplyIsUnknownNotRefused", testLostReply},
		{"RunSettlesLostReply", testRunSettlesLostReply},
		{"UnreachableIsNotApplied", testUnreachable},
		{"OperationIDsResolveFinally", testOperationIDs},
		{"PruneOperations", testPruneOperations},
		{"SourceVersions", testSourceVersions},
		{"EpochBumpFencesEarlierLeases", testEpochBump},
		{"EpochComesFromTheClock", testEpochFromClock},
		{"SmallEpochKeepsWorking", testSmallEpoch},
		{"TotalLossNeverReissuesAToken", testTotalLoss},
		{"TotalLossAfterABump", testTotalLossAfterBump},
		{"WaiterWokenBySignal", testWokenBySignal},
		{"WaiterRetriesAtExpiry", testWaiterRetriesAtExpiry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, &env{Target: newTarget(t)})
		})
	}
}

type env struct {
	Target
}

// store opens a store on its own connection: one per worker.
func (e *env) store(t *testing.T) *fenced.Store {
	t.Helper()
	drv := e.Open(t)
	s, err := fenced.New(ctx(t), drv, e.config(&fenced.Config{MaxPayloadBytes: 1 << 20}))
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// config returns c (nil: the defaults) with the target's durability opt-in.
func (e *env) config(c *fenced.Config) *fenced.Config {
	var out fenced.Config
	if c != nil {
		out = *c
	}
	out.AllowNonDurable = e.AllowNonDurable
	return &out
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func provision(t *testing.T, s *fenced.Store, resources ...string) {
	t.Helper()
	if err := s.Provision(ctx(t), resources...); err != nil {
		t.Fatalf("provision: %v", err)
	}
}

func acquire(t *testing.T, s *fenced.Store, resource string, ttl time.Duration) *fenced.Lease {
	t.Helper()
	l, err := s.Acquire(ctx(t), resource, ttl)
	if err != nil {
		t.Fatalf("acquire %s: %v", resource, err)
	}
	return l
}

func (e *env) expire(t *testing.T, resource string) {
	t.Helper()
	if err := e.Expire(ctx(t), resource); err != nil {
		t.Fatalf("expire %s: %v", resource, err)
	}
}

func show(t *testing.T, s *fenced.Store, resource string) fenced.State {
	t.Helper()
	st, err := s.Show(ctx(t), resource)
	if err != nil {
		t.Fatalf("show %s: %v", resource, err)
	}
	return st
}

// wantRefused checks that err is a refusal with the given cause.
func wantRefused(t *testing.T, err error, cause fenced.Cause) {
	t.Helper()
	var re *fenced.RefusedError
	if !errors.As(err, &re) || !errors.Is(err, fenced.ErrRefused) {
		t.Fatalf("got %v, want a refusal (%s)", err, cause)
	}
	if re.Cause != cause {
		t.Fatalf("refusal cause = %s, want %s (%v)", re.Cause, cause, err)
	}
}

// wantRefusedSaying checks that err is a refusal with the given cause whose message contains
// msg.
func wantRefusedSaying(t *testing.T, err error, cause fenced.Cause, msg string) {
	t.Helper()
	wantRefused(t, err, cause)
	if !strings.Contains(err.Error(), msg) {
		t.Fatalf("refusal %q does not say %q", err, msg)
	}
}

func wantPublished(t *testing.T, s *fenced.Store, resource string, payload []byte, gen int64) {
	t.Helper()
	got, g, err := s.Get(ctx(t), resource)
	if err != nil {
		t.Fatalf("get %s: %v", resource, err)
	}
	if !bytes.Equal(got, payload) || g != gen {
		t.Fatalf("published = %q at generation %d, want %q at %d", got, g, payload, gen)
	}
	if st := show(t, s, resource); st.PublishedGeneration != gen {
		t.Fatalf("published generation = %d, want %d", st.PublishedGeneration, gen)
	}
}

// testHandover: A is held just before publishing while its lease expires and B acquires; A's
// publication must be refused although B has not written anything yet.
func testHandover(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	provision(t, a, "report")
	leaseA := acquire(t, a, "report", time.Minute)

	atPublish, goPublish := make(chan struct{}), make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		close(atPublish)
		<-goPublish
		errA <- leaseA.Publish(context.Background(), []byte("from A"))
	}()
	<-atPublish
	e.expire(t, "report")
	leaseB := acquire(t, b, "report", time.Minute)
	close(goPublish) // B has acquired and not published: only its acquisition fences A
	wantRefused(t, <-errA, fenced.CauseSuperseded)
	if st := show(t, b, "report"); st.PublishedGeneration != 0 {
		t.Fatalf("A's refused publication changed the row: %+v", st)
	}
	if err := leaseB.Publish(ctx(t), []byte("from B")); err != nil {
		t.Fatalf("B publish: %v", err)
	}
	wantPublished(t, b, "report", []byte("from B"), leaseB.Generation())
	if leaseB.Generation() != leaseA.Generation()+1 {
		t.Fatalf("generations A=%d B=%d", leaseA.Generation(), leaseB.Generation())
	}
}

// testHandoverThroughRun is the same schedule with A inside Run, held in its build.
func testHandoverThroughRun(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	provision(t, a, "report")

	built, finish := make(chan *fenced.Lease), make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		_, err := fenced.Run(context.Background(), a, "report", &fenced.RunOptions{TTL: time.Minute},
			func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
				built <- l
				<-finish
				return []byte("from A"), nil
			})
		errA <- err
	}()
	leaseA := <-built
	e.expire(t, "report")
	leaseB := acquire(t, b, "report", time.Minute)
	close(finish)
	wantRefused(t, <-errA, fenced.CauseSuperseded)

	if st := show(t, b, "report"); st.Owner != leaseB.Owner() || st.Generation != leaseB.Generation() {
		t.Fatalf("A's Run disturbed B's lease: %+v", st)
	}
	if err := leaseB.Publish(ctx(t), []byte("from B")); err != nil {
		t.Fatalf("B publish: %v", err)
	}
	wantPublished(t, b, "report", []byte("from B"), leaseA.Generation()+1)
}

// testStaleRelease: A releases after B acquired; B's lease is untouched.
func testStaleRelease(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	provision(t, a, "r")
	leaseA := acquire(t, a, "r", time.Minute)
	e.expire(t, "r")
	leaseB := acquire(t, b, "r", time.Minute)
	before := show(t, b, "r")

	wantRefused(t, leaseA.Release(ctx(t)), fenced.CauseSuperseded)
	after := show(t, b, "r")
	if after.Owner != leaseB.Owner() || after.Generation != leaseB.Generation() || !after.LeaseUntil.Equal(before.LeaseUntil) {
		t.Fatalf("stale release changed B's lease: before %+v after %+v", before, after)
	}
	if err := leaseB.Publish(ctx(t), []byte("B")); err != nil {
		t.Fatalf("B publish after stale release: %v", err)
	}
}

func testPublishAfterExpiry(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Minute)
	e.expire(t, "r")
	wantRefused(t, l.Publish(ctx(t), []byte("late")), fenced.CauseExpired)
	if _, _, err := s.Get(ctx(t), "r"); !errors.Is(err, fenced.ErrNothingPublished) {
		t.Fatalf("get after refused publication: %v, want ErrNothingPublished", err)
	}
}

func testSecondPublication(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Minute)
	if err := l.Publish(ctx(t), []byte("first")); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	wantRefused(t, l.Publish(ctx(t), []byte("second")), fenced.CauseAlreadyPublished)
	wantPublished(t, s, "r", []byte("first"), l.Generation())
}

func testRenewAfterSupersession(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	provision(t, a, "r")
	leaseA := acquire(t, a, "r", time.Minute)
	e.expire(t, "r")
	leaseB := acquire(t, b, "r", time.Minute)
	before := show(t, b, "r")
	wantRefused(t, leaseA.Renew(ctx(t), time.Hour), fenced.CauseSuperseded)
	select {
	case <-leaseA.Done():
	default:
		t.Fatal("a refused renewal did not end the lease locally")
	}
	if !errors.Is(leaseA.Err(), fenced.ErrLeaseLost) {
		t.Fatalf("lease error = %v, want ErrLeaseLost", leaseA.Err())
	}
	after := show(t, b, "r")
	if after.Owner != leaseB.Owner() || !after.LeaseUntil.Equal(before.LeaseUntil) {
		t.Fatalf("stale renewal changed B's lease: before %+v after %+v", before, after)
	}
}

func testRenewAfterExpiry(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Minute)
	e.expire(t, "r")
	wantRefused(t, l.Renew(ctx(t), time.Hour), fenced.CauseExpired)
	if st := show(t, s, "r"); st.Held() {
		t.Fatalf("a refused renewal revived the lease: %+v", st)
	}
	wantRefused(t, l.Publish(ctx(t), []byte("x")), fenced.CauseExpired)
	// The expired lease is free for the next owner.
	if l2 := acquire(t, s, "r", time.Minute); l2.Generation() != l.Generation()+1 {
		t.Fatalf("next generation = %d, want %d", l2.Generation(), l.Generation()+1)
	}
}

func testRenewExtends(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Second)
	first := show(t, s, "r").LeaseUntil
	if err := l.Renew(ctx(t), time.Hour); err != nil {
		t.Fatalf("renew: %v", err)
	}
	st := show(t, s, "r")
	if !st.LeaseUntil.After(first.Add(50*time.Minute)) || !st.LeaseUntil.Equal(l.LeaseUntil()) {
		t.Fatalf("lease until %s after renewing for an hour (was %s, lease says %s)", st.LeaseUntil, first, l.LeaseUntil())
	}
	if err := l.Renew(ctx(t), time.Hour); err != nil { // same value again: still a match
		t.Fatalf("second renew: %v", err)
	}
	if err := l.Publish(ctx(t), []byte("ok")); err != nil {
		t.Fatalf("publish after renew: %v", err)
	}
}

// testOverlappingAcquisitions releases many workers, each on its own connection, at once at a
// barrier: every round has exactly one winner, and generations rise by one per round.
func testOverlappingAcquisitions(t *testing.T, e *env) {
	const workers, rounds = 8, 10
	stores := make([]*fenced.Store, workers)
	for i := range stores {
		stores[i] = e.store(t)
	}
	provision(t, stores[0], "hot")
	for round := 1; round <= rounds; round++ {
		start := make(chan struct{})
		leases := make([]*fenced.Lease, workers)
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for i := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				leases[i], errs[i] = stores[i].Acquire(context.Background(), "hot", time.Minute)
			}()
		}
		close(start)
		wg.Wait()
		var winner *fenced.Lease
		for i, err := range errs {
			switch {
			case err == nil && winner != nil:
				t.Fatalf("round %d: two winners, generations %d and %d", round, winner.Generation(), leases[i].Generation())
			case err == nil:
				winner = leases[i]
			case !errors.Is(err, fenced.ErrBusy):
				t.Fatalf("round %d: worker %d: %v, want busy", round, i, err)
			}
		}
		if winner == nil {
			t.Fatalf("round %d: no winner", round)
		}
		if winner.Generation() != int64(round) {
			t.Fatalf("round %d: generation %d", round, winner.Generation())
		}
		if err := winner.Release(ctx(t)); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
	}
}

func testGenerationsSurvive(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	for i := 1; i <= 3; i++ {
		l := acquire(t, s, "r", time.Minute)
		if l.Generation() != int64(i) {
			t.Fatalf("generation %d, want %d", l.Generation(), i)
		}
		if err := l.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	reopened := e.store(t)
	provision(t, reopened, "r") // provisioning again must not reset anything
	if l := acquire(t, reopened, "r", time.Minute); l.Generation() != 4 {
		t.Fatalf("after reopening: generation %d, want 4", l.Generation())
	}
}

func testBadInput(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Minute)
	before := show(t, s, "r")
	long := string(bytes.Repeat([]byte("x"), fenced.MaxResourceLen+1))
	checks := []struct {
		name string
		err  error
	}{
		{"empty resource provision", s.Provision(ctx(t), "")},
		{"long resource provision", s.Provision(ctx(t), long)},
		{"control character", s.Provision(ctx(t), "a\nb")},
		{"zero ttl", func() error { _, err := s.Acquire(ctx(t), "r", 0); return err }()},
		{"negative ttl", func() error { _, err := s.Acquire(ctx(t), "r", -time.Second); return err }()},
		{"empty resource acquire", func() error { _, err := s.Acquire(ctx(t), "", time.Second); return err }()},
		{"renew zero ttl", l.Renew(ctx(t), 0)},
		{"payload over limit", l.Publish(ctx(t), make([]byte, 1<<20+1))},
		{"bad generation", func() error { _, err := s.LeaseFor("r", l.Owner(), fenced.Token{Epoch: 1, Generation: 0}); return err }()},
		{"bad epoch", func() error { _, err := s.LeaseFor("r", l.Owner(), fenced.Token{Epoch: 0, Generation: 1}); return err }()},
		{"bad operation id", l.Publish(ctx(t), []byte("x"), fenced.WithOpID("has space"))},
		{"negative source version", l.Publish(ctx(t), []byte("x"), fenced.WithSourceVersion(-1))},
		{"bad owner", func() error { _, err := s.LeaseFor("r", "has\x00nul", l.Token()); return err }()},
	}
	for _, c := range checks {
		var ie *fenced.InvalidError
		if !errors.Is(c.err, fenced.ErrInvalid) || !errors.As(c.err, &ie) {
			t.Errorf("%s: got %v, want ErrInvalid", c.name, c.err)
		}
	}
	after := show(t, s, "r")
	before.Now, after.Now = time.Time{}, time.Time{}
	if before != after {
		t.Fatalf("bad input changed the row: before %+v after %+v", before, after)
	}
	if _, err := s.Show(ctx(t), ""); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("show empty: %v", err)
	}
	if err := l.Publish(ctx(t), []byte("still fine")); err != nil {
		t.Fatalf("publish after bad input: %v", err)
	}
}

func testBusyAndNotProvisioned(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	if _, err := a.Acquire(ctx(t), "missing", time.Minute); !errors.Is(err, fenced.ErrNotProvisioned) || errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("acquire unprovisioned: %v, want ErrNotProvisioned", err)
	}
	if _, err := a.Show(ctx(t), "missing"); !errors.Is(err, fenced.ErrNotProvisioned) {
		t.Fatalf("show unprovisioned: %v", err)
	}
	if _, _, err := a.Get(ctx(t), "missing"); !errors.Is(err, fenced.ErrNotProvisioned) {
		t.Fatalf("get unprovisioned: %v", err)
	}
	provision(t, a, "r")
	la := acquire(t, a, "r", time.Minute)
	_, err := b.Acquire(ctx(t), "r", time.Minute)
	var be *fenced.BusyError
	if !errors.As(err, &be) || !errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("second acquire: %v, want busy", err)
	}
	if be.Generation != la.Generation() {
		t.Fatalf("busy error names generation %d, want %d", be.Generation, la.Generation())
	}
	if st := show(t, a, "r"); st.Generation != la.Generation() || st.Owner != la.Owner() {
		t.Fatalf("a busy acquisition changed the row: %+v", st)
	}
	// A lease handle for a resource that is not provisioned is refused as not provisioned.
	ghost, err := a.LeaseFor("missing", la.Owner(), fenced.Token{Epoch: 1, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ghost.Publish(ctx(t), []byte("x")); !errors.Is(err, fenced.ErrNotProvisioned) || !errors.Is(err, fenced.ErrRefused) {
		t.Fatalf("publish to unprovisioned: %v", err)
	}
}

func testProvisionIdempotent(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r", "r2")
	l := acquire(t, s, "r", time.Minute)
	if err := l.PublishAndRelease(ctx(t), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	provision(t, s, "r", "r2", "r3")
	st := show(t, s, "r")
	if st.Generation != 1 || st.PublishedGeneration != 1 {
		t.Fatalf("provision reset the row: %+v", st)
	}
	wantPublished(t, s, "r", []byte("v1"), 1)
	if st := show(t, s, "r3"); st.Generation != 0 || st.Owner != "" {
		t.Fatalf("new row: %+v", st)
	}
}

// testDatabaseErrorIsNotBusy: an acquisition that cannot reach the database fails with an
// operational error, never with busy or not provisioned.
func testDatabaseErrorIsNotBusy(t *testing.T, e *env) {
	drv := e.Open(t)
	s, err := fenced.New(ctx(t), drv, e.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	provision(t, s, "r")
	if err := drv.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Acquire(ctx(t), "r", time.Minute)
	if err == nil || errors.Is(err, fenced.ErrBusy) || errors.Is(err, fenced.ErrNotProvisioned) || errors.Is(err, fenced.ErrRefused) {
		t.Fatalf("acquire on a closed connection: %v, want an operational error", err)
	}
}

func testPayloadRoundTrip(t *testing.T, e *env) {
	s := e.store(t)
	payloads := map[string][]byte{
		"empty":  {},
		"binary": {0, 1, 2, 0xff, 0xfe, 0, '\n', '\r'},
		"large":  bytes.Repeat([]byte("0123456789abcdef"), 1<<16),
	}
	for name, p := range payloads {
		provision(t, s, name)
		l := acquire(t, s, name, time.Minute)
		if err := l.PublishAndRelease(ctx(t), p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wantPublished(t, s, name, p, 1)
		if st := show(t, s, name); st.PayloadSize != int64(len(p)) || st.PublishedAt.IsZero() {
			t.Fatalf("%s: state %+v", name, st)
		}
	}
}

func testPublishAndRelease(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Minute)
	if err := l.PublishAndRelease(ctx(t), []byte("done")); err != nil {
		t.Fatal(err)
	}
	st := show(t, s, "r")
	if st.Owner != "" || st.Held() || st.PublishedGeneration != l.Generation() {
		t.Fatalf("after publish and release: %+v", st)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done still open after release")
	}
	wantRefused(t, l.PublishAndRelease(ctx(t), []byte("again")), fenced.CauseAlreadyPublished)
	if l2 := acquire(t, s, "r", time.Minute); l2.Generation() != 2 {
		t.Fatalf("next generation %d", l2.Generation())
	}
	wantPublished(t, s, "r", []byte("done"), 1)
}

func testRunPublishes(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	res, err := fenced.Run(ctx(t), s, "r", nil, func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
		return []byte(fmt.Sprintf("built by %d", l.Generation())), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantPublished(t, s, "r", []byte("built by 1"), res.Generation)
	if st := show(t, s, "r"); st.Owner != "" {
		t.Fatalf("Run left the lease held: %+v", st)
	}
}

func testRunBuildError(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	boom := errors.New("boom")
	_, err := fenced.Run(ctx(t), s, "r", nil, func(context.Context, *fenced.Lease) ([]byte, error) {
		return []byte("partial"), boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run: %v, want the build's error", err)
	}
	st := show(t, s, "r")
	if st.PublishedGeneration != 0 || st.Owner != "" {
		t.Fatalf("after a failed build: %+v", st)
	}
}

// testRunTrustWindow: a build that outlives its trust window is cancelled with ErrLeaseLost and
// its output is discarded, even though the database has not yet let anyone else in.
func testRunTrustWindow(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	_, err := fenced.Run(ctx(t), s, "r", &fenced.RunOptions{TTL: 300 * time.Millisecond},
		func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), fenced.ErrLeaseLost) {
				t.Errorf("build context cause = %v", context.Cause(ctx))
			}
			return []byte("too late"), nil
		})
	if !errors.Is(err, fenced.ErrLeaseLost) {
		t.Fatalf("Run: %v, want ErrLeaseLost", err)
	}
	if st := show(t, s, "r"); st.PublishedGeneration != 0 {
		t.Fatalf("a lost lease published: %+v", st)
	}
}

func testRunRenews(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	const ttl = 2 * time.Second
	res, err := fenced.Run(ctx(t), s, "r", &fenced.RunOptions{TTL: ttl, Renew: true, RenewEvery: 200 * time.Millisecond},
		func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
			deadline := time.NewTimer(ttl + time.Second) // outlive the first lease
			defer deadline.Stop()
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-deadline.C:
				return []byte("long build"), nil
			}
		})
	if err != nil {
		t.Fatalf("Run with renewal: %v", err)
	}
	wantPublished(t, s, "r", []byte("long build"), res.Generation)
}

// testRunRenewalRefusedEndsBuild: once another owner takes over, the next renewal is refused and
// the build's context is cancelled; nothing is published.
func testRunRenewalRefused(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	provision(t, a, "r")
	built := make(chan *fenced.Lease)
	errA := make(chan error, 1)
	go func() {
		_, err := fenced.Run(context.Background(), a, "r", &fenced.RunOptions{TTL: time.Minute, Renew: true, RenewEvery: 20 * time.Millisecond},
			func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
				built <- l
				<-ctx.Done()
				return []byte("from A"), nil
			})
		errA <- err
	}()
	<-built
	e.expire(t, "r")
	leaseB := acquire(t, b, "r", time.Minute)
	err := <-errA
	if !errors.Is(err, fenced.ErrLeaseLost) || !errors.Is(err, fenced.ErrRefused) {
		t.Fatalf("Run: %v, want ErrLeaseLost from a refused renewal", err)
	}
	st := show(t, b, "r")
	if st.PublishedGeneration != 0 || st.Owner != leaseB.Owner() {
		t.Fatalf("after A's lost Run: %+v", st)
	}
}
