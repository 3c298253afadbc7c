package etcd

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

// ownerLease returns the etcd lease of the resource's owner key and its remaining TTL.
func ownerLease(t *testing.T, d *Driver, resource string) (clientv3.LeaseID, int64) {
	t.Helper()
	ctx := testCtx(t)
	resp, err := d.cli.Get(ctx, d.keys(resource).owner)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("owner key: %v, %v", resp, err)
	}
	id := clientv3.LeaseID(resp.Kvs[0].Lease)
	ttl, err := d.cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return id, ttl.TTL
}

// aheadDriver opens a driver on a new prefix, migrated, with its epoch bumped and the resource
// provisioned, and a channel told of each lease granted ahead.
func aheadDriver(t *testing.T, resource string) (*Driver, chan struct{}) {
	ctx := testCtx(t)
	d := openDriver(t, cluster.endpoints(), newPrefix())
	granted := make(chan struct{}, maxAhead)
	d.ahead.mu.Lock()
	d.ahead.granted = func() { granted <- struct{}{} }
	d.ahead.mu.Unlock()
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	return d, granted
}

// TestLeaseGrantedAheadOutlivesTheTTL: an acquisition that uses a lease granted ahead gets an
// etcd lease that etcd will keep for at least the TTL asked, counted from the acquisition's
// start; it is reported no later than that.
func TestLeaseGrantedAheadOutlivesTheTTL(t *testing.T) {
	ctx := testCtx(t)
	const resource = "ahead résource\x00"
	const ttl = 3 * time.Second
	d, granted := aheadDriver(t, resource)
	g, err := d.Acquire(ctx, resource, "first", ttl) // grants its own lease, and one ahead
	if err != nil {
		t.Fatal(err)
	}
	first, _ := ownerLease(t, d, resource)
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "first", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	<-granted
	d.ahead.mu.Lock()
	ready := append([]aheadLease(nil), d.ahead.leases[ttlSeconds(ttl)]...)
	d.ahead.mu.Unlock()
	if len(ready) != 1 {
		t.Fatalf("%d leases granted ahead, want 1", len(ready))
	}
	start := time.Now()
	g, err = d.Acquire(ctx, resource, "second", ttl)
	if err != nil {
		t.Fatal(err)
	}
	id, remaining := ownerLease(t, d, resource)
	if id == first || id != ready[0].id {
		t.Fatalf("the second acquisition used etcd lease %x; the first used %x, the one granted ahead is %x", id, first, ready[0].id)
	}
	// TimeToLive rounds down to whole seconds.
	if left := time.Duration(remaining+1)*time.Second - time.Since(start); left < ttl {
		t.Fatalf("the etcd lease has %d s left, less than the TTL %v from the acquisition's start", remaining, ttl)
	}
	if g.LeaseUntil.Before(start.Add(ttl)) {
		t.Fatalf("reported until %v is before start + ttl %v", g.LeaseUntil, start.Add(ttl))
	}
}

// TestStaleLeaseGrantedAheadIsNotUsed: a lease granted ahead whose grant was sent longer than
// aheadFresh ago has less left than the TTL plus a second, so it is not used; with the check
// off (the mutation) the test sees it used.
func TestStaleLeaseGrantedAheadIsNotUsed(t *testing.T) {
	for _, anyAge := range []bool{false, true} {
		used := staleLeaseUsed(t, anyAge)
		if used != anyAge {
			t.Fatalf("anyAge=%v: a stale lease granted ahead used: %v", anyAge, used)
		}
	}
}

func staleLeaseUsed(t *testing.T, anyAge bool) bool {
	ctx := testCtx(t)
	const resource = "stale ahead ресурс"
	d, granted := aheadDriver(t, resource)
	g, err := d.Acquire(ctx, resource, "first", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "first", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	<-granted
	a := &d.ahead
	a.mu.Lock()
	list := a.leases[ttlSeconds(time.Second)]
	if len(list) != 1 {
		a.mu.Unlock()
		t.Fatalf("%d leases granted ahead, want 1", len(list))
	}
	stale := list[0].id
	list[0].sent = list[0].sent.Add(-aheadFresh) // as if granted a second earlier
	a.anyAge = anyAge
	a.mu.Unlock()
	if _, err := d.Acquire(ctx, resource, "second", time.Second); err != nil {
		t.Fatal(err)
	}
	id, _ := ownerLease(t, d, resource)
	return id == stale
}

// TestCachedSnapshotIsOnlyAHint: after another driver acquired and released the resource, the
// snapshot this driver cached is stale; its Txn fails inside etcd and the acquisition goes on
// from etcd's answer with the next generation.
func TestCachedSnapshotIsOnlyAHint(t *testing.T) {
	ctx := testCtx(t)
	const resource = "cached ресурс"
	d, _ := aheadDriver(t, resource)
	other := New(d.cli, &Options{Prefix: d.prefix})
	t.Cleanup(func() { _ = other.Close() })
	g, err := d.Acquire(ctx, resource, "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "a", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	o, err := other.Acquire(ctx, resource, "b", time.Minute)
	if err != nil || o.Generation != g.Generation+1 {
		t.Fatalf("other acquire: %+v %v", o, err)
	}
	if _, err := d.Acquire(ctx, resource, "c", time.Minute); err == nil {
		t.Fatal("acquired a resource that another driver holds, from a stale cached snapshot")
	}
	if ok, err := other.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "b", Epoch: o.Epoch, Generation: o.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	c, err := d.Acquire(ctx, resource, "c", time.Minute)
	if err != nil || c.Generation != o.Generation+1 || c.Epoch != g.Epoch {
		t.Fatalf("acquire after the other's release: %+v %v, want generation %d", c, err, o.Generation+1)
	}
}

// TestReleasedLeaseServesOneAcquisitionAtATime: a lease from the pool goes back to it when a
// release deletes the key on it, and the next acquisition uses it; while it carries an owner
// key, no other acquisition gets it.
func TestReleasedLeaseServesOneAcquisitionAtATime(t *testing.T) {
	ctx := testCtx(t)
	const r1, r2, r3 = "one ресурс", "two\x00 resource", "three résource"
	d, granted := aheadDriver(t, r1)
	for _, r := range []string{r2, r3} {
		if err := d.Provision(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	g, err := d.Acquire(ctx, r1, "warm-up", time.Minute) // its own lease; one granted ahead
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: r1, Owner: "warm-up", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	<-granted
	// No more grants ahead from here on, so that the pool holds only what releases give back.
	key := ttlSeconds(time.Minute)
	setPending := func(n int) {
		d.ahead.mu.Lock()
		defer d.ahead.mu.Unlock()
		d.ahead.pending[key] = n
	}
	setPending(maxAhead)
	defer setPending(0)
	g1, err := d.Acquire(ctx, r1, "first", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pooled, _ := ownerLease(t, d, r1)
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: r1, Owner: "first", Epoch: g1.Epoch, Generation: g1.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if _, err := d.Acquire(ctx, r2, "second", time.Minute); err != nil {
		t.Fatal(err)
	}
	if id, _ := ownerLease(t, d, r2); id != pooled {
		t.Fatalf("the next acquisition got etcd lease %x, not the released %x", id, pooled)
	}
	if _, err := d.Acquire(ctx, r3, "third", time.Minute); err != nil {
		t.Fatal(err)
	}
	if id, _ := ownerLease(t, d, r3); id == pooled {
		t.Fatalf("etcd lease %x carries the owner keys of two acquisitions at once", id)
	}
}
