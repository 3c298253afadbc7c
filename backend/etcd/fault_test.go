package etcd

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
)

// These tests stop cluster members. They do not call t.Parallel, so they run after the
// conformance suite's parallel tests have finished, and each restarts what it stopped and
// waits for all three members to agree on a leader before it returns.

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newStore(t *testing.T, d *Driver) *fenced.Store {
	t.Helper()
	s, err := fenced.New(testCtx(t), d, &fenced.Config{MaxPayloadBytes: 1 << 20})
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return s
}

// killMember stops member i and restarts it on its own data when the test ends.
func killMember(t *testing.T, i int) {
	t.Helper()
	cluster.kill(i)
	t.Cleanup(func() {
		if err := cluster.start(i); err != nil {
			t.Fatalf("restart: %v", err)
		}
		if err := cluster.waitReady(i); err != nil {
			t.Fatalf("restart: %v", err)
		}
		if _, err := cluster.leader(testCtx(t)); err != nil {
			t.Fatalf("after restart: %v", err)
		}
	})
}

func wantCause(t *testing.T, err error, cause fenced.Cause) {
	t.Helper()
	var re *fenced.RefusedError
	if !errors.As(err, &re) || re.Cause != cause {
		t.Fatalf("got %v, want a refusal (%s)", err, cause)
	}
}

func wantPublished(t *testing.T, s *fenced.Store, resource string, payload []byte, gen int64) {
	t.Helper()
	got, g, err := s.Get(testCtx(t), resource)
	if err != nil || !bytes.Equal(got, payload) || g != gen {
		t.Fatalf("get = %q at %d (%v), want %q at %d", got, g, err, payload, gen)
	}
}

// TestLeaderKilledDuringHandover: A acquires; the leader dies; once a new leader is elected
// A's lease is still held (etcd carries leases across leader changes); then A's etcd lease
// ends, B acquires, A's held-back publication is refused and B's is accepted.
func TestLeaderKilledDuringHandover(t *testing.T) {
	ctx := testCtx(t)
	lead, err := cluster.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	survivors := cluster.endpoints(lead)
	prefix := newPrefix()
	a := newStore(t, openDriver(t, survivors, prefix))
	b := newStore(t, openDriver(t, survivors, prefix))
	admin := openDriver(t, survivors, prefix)
	if err := a.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	leaseA, err := a.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	atPublish, goPublish, errA := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		close(atPublish)
		<-goPublish
		errA <- leaseA.Publish(context.Background(), []byte("from A"))
	}()
	<-atPublish

	killMember(t, lead)
	newLead, err := cluster.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newLead == lead {
		t.Fatalf("member %d still leads after being killed", lead)
	}
	if _, err := b.Acquire(ctx, "r", time.Minute); !errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("acquire during A's lease under the new leader: %v, want busy", err)
	}
	if err := expire(ctx, admin, "r"); err != nil {
		t.Fatalf("expire: %v", err)
	}
	leaseB, err := b.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatalf("B acquire under the new leader: %v", err)
	}
	if leaseB.Generation() != leaseA.Generation()+1 {
		t.Fatalf("generations A=%d B=%d", leaseA.Generation(), leaseB.Generation())
	}
	close(goPublish)
	wantCause(t, <-errA, fenced.CauseSuperseded)
	if err := leaseB.Publish(ctx, []byte("from B")); err != nil {
		t.Fatalf("B publish: %v", err)
	}
	wantPublished(t, b, "r", []byte("from B"), leaseB.Generation())
}

// TestFollowerDown: with one follower stopped, two of three members are a quorum and every
// operation still works, for clients created before and after the failure.
func TestFollowerDown(t *testing.T) {
	ctx := testCtx(t)
	lead, err := cluster.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := (lead + 1) % len(cluster.members)
	prefix := newPrefix()
	before := newStore(t, openDriver(t, cluster.endpoints(follower), prefix))
	if err := before.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	killMember(t, follower)

	after := newStore(t, openDriver(t, cluster.endpoints(), prefix)) // includes the dead member
	var gen int64
	for i, s := range []*fenced.Store{before, after, before, after} {
		l, err := s.Acquire(ctx, "r", time.Minute)
		if err != nil {
			t.Fatalf("cycle %d: acquire: %v", i, err)
		}
		if l.Generation() != gen+1 {
			t.Fatalf("cycle %d: generation %d after %d", i, l.Generation(), gen)
		}
		gen = l.Generation()
		if _, err := s.Acquire(ctx, "r", time.Minute); !errors.Is(err, fenced.ErrBusy) {
			t.Fatalf("cycle %d: second acquire: %v, want busy", i, err)
		}
		if err := l.Renew(ctx, 2*time.Minute); err != nil {
			t.Fatalf("cycle %d: renew: %v", i, err)
		}
		if err := l.Publish(ctx, []byte{byte(i)}); err != nil {
			t.Fatalf("cycle %d: publish: %v", i, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("cycle %d: release: %v", i, err)
		}
	}
	wantPublished(t, after, "r", []byte{3}, gen)
}

// TestPausedClientOutlivesItsLease: A is held before publishing while its etcd lease runs out
// on the server (no revocation: etcd's own TTL); B takes over; A's publication is refused.
// The wait is for etcd's delete event on the owner key, never a sleep.
func TestPausedClientOutlivesItsLease(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	da := openDriver(t, cluster.endpoints(), prefix)
	a, b := newStore(t, da), newStore(t, openDriver(t, cluster.endpoints(), prefix))
	if err := a.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	leaseA, err := a.Acquire(ctx, "r", time.Second) // etcd raises it to its minimum TTL
	if err != nil {
		t.Fatal(err)
	}
	owner, err := da.cli.Get(ctx, da.keys("r").owner)
	if err != nil || len(owner.Kvs) != 1 {
		t.Fatalf("owner key: %v %v", owner, err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	events := da.cli.Watch(watchCtx, da.keys("r").owner, clientv3.WithRev(owner.Header.Revision+1))

	atPublish, goPublish, errA := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		close(atPublish)
		<-goPublish
		errA <- leaseA.Publish(context.Background(), []byte("from A"))
	}()
	<-atPublish
	waitDeleted(t, events)

	if st, err := b.Show(ctx, "r"); err != nil || st.Held() || st.Owner != leaseA.Owner() {
		t.Fatalf("after etcd expired A's lease: %+v, %v; want A's, not held", st, err)
	}
	leaseB, err := b.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatalf("B acquire: %v", err)
	}
	close(goPublish)
	wantCause(t, <-errA, fenced.CauseSuperseded)
	if err := leaseB.Publish(ctx, []byte("from B")); err != nil {
		t.Fatalf("B publish: %v", err)
	}
	wantPublished(t, b, "r", []byte("from B"), leaseA.Generation()+1)
}

func waitDeleted(t *testing.T, events clientv3.WatchChan) {
	t.Helper()
	for resp := range events {
		if err := resp.Err(); err != nil {
			t.Fatalf("watch: %v", err)
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return
			}
		}
	}
	t.Fatal("watch ended before the owner key was deleted")
}

// TestLateKeepAliveRevivesNothing: a keepalive that reaches etcd for an acquisition's old etcd
// lease (one whose revocation was lost, so it is still alive) extends a lease no key uses: it
// cannot make a released, superseded or expired acquisition valid again.
func TestLateKeepAliveRevivesNothing(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	da := openDriver(t, cluster.endpoints(), prefix)
	da.skipRevoke = true // every revocation of A's driver is "lost"
	admin := openDriver(t, cluster.endpoints(), prefix)
	a, b := newStore(t, da), newStore(t, admin)
	if err := a.Provision(ctx, "r", "s"); err != nil {
		t.Fatal(err)
	}
	ownerLease := func(resource string) clientv3.LeaseID {
		resp, err := admin.cli.Get(ctx, admin.keys(resource).owner)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	keepAlive := func(id clientv3.LeaseID) {
		t.Helper()
		if _, err := admin.cli.KeepAliveOnce(ctx, id); err != nil {
			t.Fatalf("the old etcd lease should still be alive: %v", err)
		}
	}

	// Released, then superseded: A's old etcd lease outlives A's acquisition.
	leaseA, err := a.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	oldA := ownerLease("r")
	if err := leaseA.Release(ctx); err != nil {
		t.Fatal(err)
	}
	leaseB, err := b.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	keepAlive(oldA)
	if st, _ := b.Show(ctx, "r"); st.Owner != leaseB.Owner() || !st.Held() || ownerLease("r") == oldA {
		t.Fatalf("keepalive on A's old etcd lease disturbed B: %+v", st)
	}
	revived, err := a.LeaseFor("r", leaseA.Owner(), leaseA.Token())
	if err != nil {
		t.Fatal(err)
	}
	wantCause(t, revived.Publish(ctx, []byte("A")), fenced.CauseSuperseded)
	wantCause(t, revived.Renew(ctx, time.Minute), fenced.CauseSuperseded)

	// Renewed onto a new etcd lease, then expired: the one before stays alive and detached.
	leaseS, err := a.Acquire(ctx, "s", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	first := ownerLease("s")
	if err := leaseS.Renew(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if second := ownerLease("s"); second == first || second == 0 {
		t.Fatalf("renewal left the owner key on etcd lease %x (was %x)", second, first)
	}
	if err := expire(ctx, admin, "s"); err != nil { // revokes the current etcd lease only
		t.Fatal(err)
	}
	keepAlive(first)
	if st, _ := b.Show(ctx, "s"); st.Held() || ownerLease("s") != 0 {
		t.Fatalf("keepalive on the pre-renewal etcd lease revived the lease: %+v", st)
	}
	wantCause(t, leaseS.Publish(ctx, []byte("S")), fenced.CauseExpired)
	wantCause(t, leaseS.Renew(ctx, time.Minute), fenced.CauseExpired)
	for _, id := range []clientv3.LeaseID{oldA, first} {
		_, _ = admin.cli.Revoke(ctx, id)
	}
}
