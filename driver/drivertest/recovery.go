package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// wantUnknown checks that err reports an unknown outcome, never a refusal or busy.
func wantUnknown(t *testing.T, what string, err error) *fenced.OutcomeUnknownError {
	t.Helper()
	var ue *fenced.OutcomeUnknownError
	if !errors.As(err, &ue) || !errors.Is(err, fenced.ErrOutcomeUnknown) {
		t.Fatalf("%s with its reply lost: %v, want an unknown outcome", what, err)
	}
	if errors.Is(err, fenced.ErrRefused) || errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("%s with its reply lost was reported as refused or busy: %v", what, err)
	}
	return ue
}

// testLostReply: for every mutation, the engine commits and the reply is lost. The caller must
// hear "outcome unknown" (never refused or busy), and the durable state shows it happened.
func testLostReply(t *testing.T, e *env) {
	if e.LostReply == nil {
		t.Fatal("Target.LostReply is required")
	}
	direct := e.store(t)
	drv, arm := e.LostReply(t)
	lossy, err := fenced.New(ctx(t), drv, e.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lossy.Close() })
	provision(t, direct, "acq", "pub", "pubrel", "renew", "rel")

	t.Run("acquire", func(t *testing.T) {
		arm()
		_, err := lossy.Acquire(ctx(t), "acq", time.Minute)
		ue := wantUnknown(t, "acquire", err)
		if st := show(t, direct, "acq"); st.Generation != 1 || st.Owner != ue.Owner || !st.Held() {
			t.Fatalf("after a lost acquire reply: %+v, want generation 1 held by %s", st, ue.Owner)
		}
	})
	t.Run("publish", func(t *testing.T) {
		l := acquire(t, lossy, "pub", time.Minute)
		arm()
		ue := wantUnknown(t, "publish", l.Publish(ctx(t), []byte("p1"), fenced.WithOpID("lost-publish")))
		if ue.OpID != "lost-publish" {
			t.Fatalf("the unknown outcome names operation %q", ue.OpID)
		}
		wantPublished(t, direct, "pub", []byte("p1"), l.Generation())
		r, err := direct.Resolve(ctx(t), "lost-publish")
		if err != nil || !r.Accepted || r.Resource != "pub" || r.Token != l.Token() {
			t.Fatalf("resolve after a lost publish reply: %+v, %v", r, err)
		}
	})
	t.Run("publish with a generated operation id", func(t *testing.T) {
		l := acquire(t, lossy, "pubrel", time.Minute)
		arm()
		ue := wantUnknown(t, "publish and release", l.PublishAndRelease(ctx(t), []byte("p2")))
		if ue.OpID == "" {
			t.Fatal("an unknown publication without an id of the caller's does not name the generated one")
		}
		if st := show(t, direct, "pubrel"); st.Owner != "" || st.PublishedGeneration != l.Generation() {
			t.Fatalf("after a lost publish-and-release reply: %+v", st)
		}
		if r, err := direct.Resolve(ctx(t), ue.OpID); err != nil || !r.Accepted {
			t.Fatalf("resolve %s: %+v, %v", ue.OpID, r, err)
		}
	})
	t.Run("renew", func(t *testing.T) {
		l := acquire(t, lossy, "renew", time.Minute)
		arm()
		_ = wantUnknown(t, "renew", l.Renew(ctx(t), time.Hour))
		if st := show(t, direct, "renew"); st.LeaseUntil.Before(st.Now.Add(50 * time.Minute)) {
			t.Fatalf("after a lost renew reply the lease ends at %s (database now %s), want about an hour", st.LeaseUntil, st.Now)
		}
	})
	t.Run("release", func(t *testing.T) {
		l := acquire(t, lossy, "rel", time.Minute)
		arm()
		_ = wantUnknown(t, "release", l.Release(ctx(t)))
		if st := show(t, direct, "rel"); st.Owner != "" || st.Held() {
			t.Fatalf("after a lost release reply: %+v", st)
		}
	})
}

// testRunSettlesLostReply: Run's publication commits and its reply is lost; Run resolves the
// operation id and reports the success it was.
func testRunSettlesLostReply(t *testing.T, e *env) {
	direct := e.store(t)
	drv, arm := e.LostReply(t)
	lossy, err := fenced.New(ctx(t), drv, e.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lossy.Close() })
	provision(t, direct, "r")
	res, err := fenced.Run(ctx(t), lossy, "r", &fenced.RunOptions{TTL: time.Minute},
		func(context.Context, *fenced.Lease) ([]byte, error) {
			arm() // the next request is the publication
			return []byte("built"), nil
		})
	if err != nil {
		t.Fatalf("Run with its publication's reply lost: %v, want the resolved success", err)
	}
	wantPublished(t, direct, "r", []byte("built"), res.Generation)
	if st := show(t, direct, "r"); st.Owner != "" {
		t.Fatalf("after Run: %+v", st)
	}
}

// testUnreachable: a request that cannot reach the server certainly did not happen, and is
// reported so: not unknown, not busy, not refused.
func testUnreachable(t *testing.T, e *env) {
	if e.Unreachable == nil {
		t.Skip("an embedded engine has no server to be unreachable")
	}
	// The store opens although nothing answers; its failed durability check is only logged.
	quiet := slog.New(slog.DiscardHandler)
	s, err := fenced.New(ctx(t), e.Unreachable(t), e.config(&fenced.Config{SkipMigrate: true, Logger: quiet}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	l, err := s.LeaseFor("r", "owner", fenced.Token{Epoch: 1, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, acqErr := s.Acquire(ctx(t), "r", time.Minute)
	for what, err := range map[string]error{
		"acquire": acqErr,
		"publish": l.Publish(ctx(t), []byte("x")),
		"renew":   l.Renew(ctx(t), time.Minute),
		"release": l.Release(ctx(t)),
	} {
		if err == nil || errors.Is(err, fenced.ErrOutcomeUnknown) || errors.Is(err, fenced.ErrRefused) || errors.Is(err, fenced.ErrBusy) {
			t.Errorf("%s against an unreachable server: %v, want a certain failure", what, err)
		}
	}
}

// testOperationIDs: outcomes are recorded with the payload and never overwritten; resolving an
// id that never arrived records it as aborted, so a late delivery of it is refused.
func testOperationIDs(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l1 := acquire(t, s, "r", time.Minute)
	if err := l1.Publish(ctx(t), []byte("v1"), fenced.WithOpID("op-1")); err != nil {
		t.Fatal(err)
	}
	for range 2 { // resolving is repeatable and answers the same
		r, err := s.Resolve(ctx(t), "op-1")
		if err != nil || !r.Accepted || r.Resource != "r" || r.Token != l1.Token() || r.RecordedAt.IsZero() {
			t.Fatalf("resolve op-1: %+v, %v", r, err)
		}
	}
	if err := l1.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	l2 := acquire(t, s, "r", time.Minute)
	// A replay of an accepted operation by a newer lease is refused and changes nothing.
	wantRefused(t, l2.Publish(ctx(t), []byte("replay"), fenced.WithOpID("op-1")), fenced.CauseOperationExists)
	wantPublished(t, s, "r", []byte("v1"), l1.Generation())

	// An id that never arrived is resolved as not accepted, and that answer is final.
	r, err := s.Resolve(ctx(t), "op-late")
	if err != nil || r.Accepted {
		t.Fatalf("resolve an id that never arrived: %+v, %v", r, err)
	}
	wantRefused(t, l2.Publish(ctx(t), []byte("late"), fenced.WithOpID("op-late")), fenced.CauseOperationExists)
	if r, err := s.Resolve(ctx(t), "op-late"); err != nil || r.Accepted {
		t.Fatalf("resolve op-late again: %+v, %v", r, err)
	}
	wantPublished(t, s, "r", []byte("v1"), l1.Generation())

	// Reading an outcome records nothing.
	if op, err := s.Driver().ReadOperation(ctx(t), "op-2"); err != nil || op.Outcome != "" {
		t.Fatalf("read an unrecorded id: %+v, %v", op, err)
	}
	if err := l2.Publish(ctx(t), []byte("v2"), fenced.WithOpID("op-2")); err != nil {
		t.Fatalf("publish after only reading the id: %v", err)
	}
	wantPublished(t, s, "r", []byte("v2"), l2.Generation())
	if r, err := s.Resolve(ctx(t), "op-1"); err != nil || !r.Accepted || r.Token != l1.Token() {
		t.Fatalf("a later publication overwrote op-1's record: %+v, %v", r, err)
	}
	if _, err := s.Resolve(ctx(t), ""); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("resolve an empty id: %v", err)
	}
}

func testPruneOperations(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	l := acquire(t, s, "r", time.Minute)
	if err := l.Publish(ctx(t), []byte("v"), fenced.WithOpID("old")); err != nil {
		t.Fatal(err)
	}
	// The store refuses an age below its minimum, so the driver is asked directly for short ones.
	if n, err := s.Driver().PruneOperations(ctx(t), time.Hour); err != nil || n != 0 {
		t.Fatalf("prune records older than an hour: %d, %v", n, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for { // until the database's clock has moved past the record
		n, err := s.Driver().PruneOperations(ctx(t), time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record was not pruned (pruned %d)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if op, err := s.Driver().ReadOperation(ctx(t), "old"); err != nil || op.Outcome != "" {
		t.Fatalf("after pruning: %+v, %v", op, err)
	}
	for _, age := range []time.Duration{0, time.Hour, s.MinPruneAge() - time.Nanosecond} {
		if _, err := s.PruneOperations(ctx(t), age); !errors.Is(err, fenced.ErrInvalid) {
			t.Fatalf("prune with age %s, below the minimum %s: %v", age, s.MinPruneAge(), err)
		}
	}
	if n, err := s.PruneOperations(ctx(t), s.MinPruneAge()); err != nil || n != 0 {
		t.Fatalf("prune with the minimum age: %d, %v", n, err)
	}
}

// testSourceVersions: a publication whose source is older than the published one is refused,
// whatever its generation; one without a source version is not checked and keeps the version.
func testSourceVersions(t *testing.T, e *env) {
	s := e.store(t)
	provision(t, s, "r")
	publish := func(payload string, opts ...fenced.PublishOption) error {
		l := acquire(t, s, "r", time.Minute)
		defer func() { _ = l.Release(ctx(t)) }()
		return l.Publish(ctx(t), []byte(payload), opts...)
	}
	if err := publish("v5", fenced.WithSourceVersion(5)); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, publish("v3", fenced.WithSourceVersion(3)), fenced.CauseStaleSource)
	if st := show(t, s, "r"); st.SourceVersion != 5 {
		t.Fatalf("source version %d after a stale one was refused", st.SourceVersion)
	}
	if err := publish("v5 again", fenced.WithSourceVersion(5)); err != nil {
		t.Fatalf("the same source version: %v", err)
	}
	if err := publish("unversioned"); err != nil {
		t.Fatalf("without a source version: %v", err)
	}
	if st := show(t, s, "r"); st.SourceVersion != 5 {
		t.Fatalf("an unversioned publication changed the source version to %d", st.SourceVersion)
	}
	wantRefused(t, publish("v4", fenced.WithSourceVersion(4)), fenced.CauseStaleSource)
	if err := publish("v9", fenced.WithSourceVersion(9)); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Get(ctx(t), "r")
	if err != nil || !bytes.Equal(got, []byte("v9")) {
		t.Fatalf("published %q, %v", got, err)
	}
}

// testEpochBump: after a bump, every lease issued before it is refused (also one presenting the
// current generation with the old epoch), leases are free, and the next token is greater.
func testEpochBump(t *testing.T, e *env) {
	a, b := e.store(t), e.store(t)
	const res = "nightly report é/1" // a space and non-ASCII
	provision(t, a, res, "idle")
	for range 2 { // so that no epoch equals a generation below
		if err := acquire(t, a, res, time.Minute).Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	la := acquire(t, a, res, time.Minute)
	if la.Epoch() < 1 {
		t.Fatalf("first epoch %d, want at least 1", la.Epoch())
	}
	clock := show(t, b, "idle").Now.UnixMicro()
	epoch, err := b.BumpEpoch(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	// max(epoch + 1, the engine's clock in microseconds): see driver.Driver.BumpEpoch.
	if epoch <= la.Epoch() || epoch < clock {
		t.Fatalf("bumped to epoch %d, want above %d and at least the engine's clock %d", epoch, la.Epoch(), clock)
	}
	st := show(t, b, res)
	if st.Held() || st.CurrentEpoch != epoch {
		t.Fatalf("after the bump: %+v", st)
	}
	// Nothing superseded la: the bump freed it, and the refusal says so with the whole token.
	bumped := fmt.Sprintf("lease %s was acquired before the epoch was bumped to %d", la.Token(), epoch)
	wantRefusedSaying(t, la.Publish(ctx(t), []byte("old epoch")), fenced.CauseEpochBumped, bumped)
	wantRefusedSaying(t, la.Renew(ctx(t), time.Minute), fenced.CauseEpochBumped, bumped)
	wantRefusedSaying(t, la.Release(ctx(t)), fenced.CauseEpochBumped, bumped)

	lb := acquire(t, b, res, time.Minute)
	if lb.Epoch() != epoch || lb.Generation() != la.Generation()+1 || lb.Token().Compare(la.Token()) <= 0 {
		t.Fatalf("token after the bump %s, before %s", lb.Token(), la.Token())
	}
	// The same owner and generation with the old epoch is not this lease.
	forged, err := a.LeaseFor(res, lb.Owner(), fenced.Token{Epoch: la.Epoch(), Generation: lb.Generation()})
	if err != nil {
		t.Fatal(err)
	}
	wrongEpoch := fmt.Sprintf("names the wrong epoch: this owner acquired generation %d in epoch %d (token %s)",
		lb.Generation(), epoch, lb.Token())
	wantRefusedSaying(t, forged.Publish(ctx(t), []byte("forged")), fenced.CauseEpochMismatch, wrongEpoch)
	wantRefusedSaying(t, forged.Renew(ctx(t), time.Minute), fenced.CauseEpochMismatch, wrongEpoch)
	wantRefusedSaying(t, forged.Release(ctx(t)), fenced.CauseEpochMismatch, wrongEpoch)
	// The old lease, once another acquisition has taken the resource, is superseded by it.
	wantRefusedSaying(t, la.Publish(ctx(t), []byte("old epoch")), fenced.CauseSuperseded,
		fmt.Sprintf("lease %s was superseded by lease %s", la.Token(), lb.Token()))
	if st := show(t, a, res); st.Owner != lb.Owner() || !st.Held() || st.PublishedGeneration != 0 {
		t.Fatalf("a refused lease changed the row: %+v", st)
	}
	// The holder is busy for everyone else, and the error names its whole token.
	if _, err := a.Acquire(ctx(t), res, time.Minute); err == nil || !strings.Contains(err.Error(), "lease "+lb.Token().String()+" is held") {
		t.Fatalf("acquire while %s holds: %v", lb.Token(), err)
	}
	if err := lb.Publish(ctx(t), []byte("new epoch")); err != nil {
		t.Fatal(err)
	}
	if st := show(t, a, res); st.PublishedEpoch != epoch || st.Epoch != epoch || st.PublishedGeneration != lb.Generation() {
		t.Fatalf("published token: %+v", st)
	}
	e2, err := a.BumpEpoch(ctx(t))
	if err != nil || e2 <= epoch {
		t.Fatalf("second bump: %d after %d, %v", e2, epoch, err)
	}
	if l := acquire(t, a, "idle", time.Minute); l.Epoch() != e2 || l.Generation() != 1 {
		t.Fatalf("a resource never acquired before gets %s", l.Token())
	}
}
