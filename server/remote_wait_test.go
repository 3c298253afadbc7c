package server_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// The remote driver is a driver.Waiter: Store.AcquireWait over it sends wait_ms, and the
// service does the waiting (parked, first come, first served among its waiters).

// remoteWaiter waits for parkedResource through the service in a goroutine of its own.
func remoteWaiter(t *testing.T, s *fenced.Store, ctx context.Context, opts ...fenced.WaitOption) <-chan waitResult {
	t.Helper()
	got := make(chan waitResult, 1)
	go func() {
		l, err := s.AcquireWait(ctx, parkedResource, time.Minute, opts...)
		got <- waitResult{l, err}
	}()
	return got
}

type waitResult struct {
	lease *fenced.Lease
	err   error
}

// TestRemoteWaitIsParkedInService: Store.AcquireWait through the remote driver waits in the
// service (its waiter is parked there, fenced_waiters counts it) with the owner the client
// chose, and is granted when the holder releases through the service. The service's store
// polls hourly, so only its own release wakes the waiter; a client that polled instead would
// never be parked (the mutant without the driver.Waiter branch in Store.AcquireWait fails at
// the "parked" event).
func TestRemoteWaitIsParkedInService(t *testing.T) {
	ps := newParkedService(t)
	holder := ps.hold(t)
	client := remoteStore(t, ps.h, "")
	const owner = "remote waiter ü"
	got := remoteWaiter(t, client, testCtx(t), fenced.AsOwner(owner))
	ps.event(t, "parked")
	if n := ps.metric(t, "fenced_waiters"); n != 1 {
		t.Fatalf("fenced_waiters %v while the remote client waits", n)
	}
	if err := holder.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the remote waiter: %v", r.err)
	}
	ps.event(t, "answered")
	l := r.lease
	if l.Generation() != holder.Generation()+1 || l.Owner() != owner || l.Epoch() != holder.Epoch() {
		t.Fatalf("the remote waiter got %s owned by %q; want generation %d owned by %q", l.Token(), l.Owner(), holder.Generation()+1, owner)
	}
	select {
	case <-l.Done():
		t.Fatalf("the granted lease is not trusted: %v", l.Err())
	default:
	}
	if err := l.PublishAndRelease(testCtx(t), []byte("waited\x00ü")); err != nil {
		t.Fatal(err)
	}
	ps.metrics(t, map[string]float64{
		"fenced_waiters": 0,
		`fenced_wait_seconds_count{result="granted"}`: 1,
	})
}

// limitedService is a service over SQLite whose waits are limited to maxWait.
func limitedService(t *testing.T, maxWait time.Duration) (*harness, *fenced.Store) {
	t.Helper()
	store, err := fenced.New(testCtx(t), sqliteBacking(t).open(t), &fenced.Config{WaitPollMin: time.Hour, WaitPollMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	h := startServerWith(t, store, &server.Options{MaxWait: maxWait, Logger: slog.New(slog.DiscardHandler)}, false)
	if err := store.Provision(testCtx(t), parkedResource); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return h, store
}

// TestRemoteWaitKeepsItsDeadline: a client whose deadline is beyond the service's limit on
// one wait asks again, and gives up busy no earlier than its own deadline (the mutant that
// returns the first busy answer gives up at the service's limit, 100 ms).
func TestRemoteWaitKeepsItsDeadline(t *testing.T) {
	h, store := limitedService(t, 100*time.Millisecond)
	holder, err := store.Acquire(testCtx(t), parkedResource, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client := remoteStore(t, h, "")
	const deadline = 450 * time.Millisecond
	start := time.Now()
	ctx, cancel := context.WithTimeout(testCtx(t), deadline)
	defer cancel()
	_, err = client.AcquireWait(ctx, parkedResource, time.Minute)
	took := time.Since(start)
	var busy *fenced.BusyError
	if !errors.As(err, &busy) || !errors.Is(err, context.DeadlineExceeded) || busy.Generation != holder.Generation() {
		t.Fatalf("a wait that outlasts its deadline: %v; want busy (generation %d) and the deadline", err, holder.Generation())
	}
	if took < deadline {
		t.Fatalf("the waiter gave up after %s, before its deadline %s", took, deadline)
	}
	if st, err := store.Show(testCtx(t), parkedResource); err != nil || st.Owner != holder.Owner() {
		t.Fatalf("after the wait the holder lost its lease: %+v %v", st, err)
	}
}

// lostWaitReply is the remote driver with the reply to a granted waiting acquisition lost
// between the service and the client (as fenced torture's drop-reply fault does).
type lostWaitReply struct {
	*remote.Driver
}

func (d lostWaitReply) AcquireWait(ctx context.Context, resource, owner string, ttl, wait time.Duration) (driver.Grant, error) {
	if _, err := d.Driver.AcquireWait(ctx, resource, owner, ttl, wait); err != nil {
		return driver.Grant{}, err
	}
	return driver.Grant{}, errors.New("the reply was lost")
}

// TestRemoteWaitLostReplySettled: the reply to a granted waiting acquisition is lost. The
// client reports the outcome unknown with its owner, and, having found that owner in the row,
// releases the lease, which is not left held by nobody for its TTL (the mutant without the
// settling read leaves it held).
func TestRemoteWaitLostReplySettled(t *testing.T) {
	h, store := limitedService(t, time.Minute)
	client, err := fenced.New(testCtx(t), lostWaitReply{client(t, h.addr, "")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before, err := store.Show(testCtx(t), parkedResource)
	if err != nil {
		t.Fatal(err)
	}
	const owner = "lost reply ü"
	_, err = client.AcquireWait(testCtx(t), parkedResource, time.Hour, fenced.AsOwner(owner))
	var unknown *fenced.OutcomeUnknownError
	if !errors.As(err, &unknown) || unknown.Owner != owner {
		t.Fatalf("a waiting acquisition whose reply was lost: %v; want outcome unknown naming owner %q", err, owner)
	}
	st, err := store.Show(testCtx(t), parkedResource)
	if err != nil {
		t.Fatal(err)
	}
	if st.Generation != before.Generation+1 || st.Held() {
		t.Fatalf("after the lost reply: generation %d (before %d), held by %q; want it granted and released",
			st.Generation, before.Generation, st.Owner)
	}
}

// TestRemoteWaitAfterEpochBumpPostgres: on PostgreSQL, a remote client waits in the service
// while the holder keeps its lease; an epoch bump through the service frees it, PostgreSQL's
// NOTIFY wakes the service's waiter (its store polls hourly), and the client gets the lease
// in the new epoch.
func TestRemoteWaitAfterEpochBumpPostgres(t *testing.T) {
	back := postgresBacking(t)
	store, err := fenced.New(testCtx(t), back.open(t), &fenced.Config{WaitPollMin: time.Hour, WaitPollMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv, err := server.New(store, &server.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 16)
	server.SetHook(srv, func(e string) { events <- e })
	h := startServerWith(t, store, nil, false)
	hd := srv.Handler()
	h.handler.Store(&hd)
	client := remoteStore(t, h, "")
	if err := client.Provision(testCtx(t), parkedResource); err != nil {
		t.Fatal(err)
	}
	if _, err := client.BumpEpoch(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	holder, err := client.Acquire(testCtx(t), parkedResource, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := remoteWaiter(t, client, testCtx(t))
	if e := <-events; e != "parked" {
		t.Fatalf("the service's first event is %q, want parked", e)
	}
	epoch, err := client.BumpEpoch(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the remote waiter after the bump: %v", r.err)
	}
	if r.lease.Epoch() != epoch || r.lease.Generation() != holder.Generation()+1 {
		t.Fatalf("the remote waiter got %s; want epoch %d, generation %d", r.lease.Token(), epoch, holder.Generation()+1)
	}
	if err := r.lease.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
