package etcd

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/internal/trustclock"
)

// TestPooledLeaseAfterASuspend: etcd's server keeps counting while the client's machine is
// suspended, so a pooled etcd lease whose remaining life a suspend used up must not serve an
// acquisition after it: etcd may expire it before the acquisition's start + TTL, while the
// holder's trust window (on trustclock, which counts the suspend) runs to start + TTL less
// the margin. trustclock.Suspend stands in for the suspend; etcd's clock does not jump here,
// so what the test checks in etcd is that the lease used was granted after the suspend and
// lasts the TTL from the acquisition's start. Judged on Go's monotonic clock (before the
// fix), the pools' windows ignored the suspend and each subtest saw the pooled lease taken.
// The file sorts first, so that the package's other tests run on the jumped clock too.
func TestPooledLeaseAfterASuspend(t *testing.T) {
	const ttl = 3 * time.Second
	for _, past := range []string{"its window", "its life"} {
		t.Run("granted ahead, suspended past "+past, func(t *testing.T) {
			const resource = "suspended ahead résource\x00"
			d, granted := aheadDriver(t, resource)
			d.ahead.bound = 5 * time.Second // its window is open from the grant's answer for 5 s
			pooled := pooledLease(t, d, granted, resource, ttl)
			now := trustclock.Now()
			if !pooled.usable(ttl, now, false) {
				t.Skipf("the lease granted ahead %v ago is out of its window before the suspend", now-pooled.sent)
			}
			_, end := pooled.window(ttl)
			if past == "its life" {
				end = pooled.ends()
			}
			suspendPast(t, d, resource, pooled.id, end-now+100*time.Millisecond, ttl)
		})
	}
	// A lease of the reuse pool gets a keepalive before it serves, which starts its life
	// again, so the suspend only makes that keepalive vain (etcd answers "not found" after a
	// real one): the lease is dropped without it.
	t.Run("reuse pool", func(t *testing.T) {
		const resource = "suspended reuse résource"
		d := reuseDriver(t, newClient(t, cluster.endpoints()), nil, resource)
		released := acquireReleased(t, d, resource)
		d.ahead.mu.Lock()
		list := d.ahead.reuse.idle[ttlSeconds(reuseTTL)]
		d.ahead.mu.Unlock()
		if len(list) != 1 || list[0].id != released {
			t.Fatalf("reuse pool %+v, want etcd lease %x alone", list, released)
		}
		suspendPast(t, d, resource, released, list[0].ends()-reuseMargin-trustclock.Now()+100*time.Millisecond, reuseTTL)
		if d.idle(released) {
			t.Fatal("the lease whose life the suspend used up is still in the reuse pool")
		}
	})
}

// suspendPast suspends the machine for suspend, then acquires the resource for ttl and checks that
// the pooled etcd lease was not used: the one used was granted after the suspend and etcd
// keeps it at least ttl from the acquisition's start, as the reported LeaseUntil says.
func suspendPast(t *testing.T, d *Driver, resource string, pooled clientv3.LeaseID, suspend, ttl time.Duration) {
	t.Helper()
	ctx := testCtx(t)
	before, err := d.cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	trustclock.Suspend(suspend)
	start, wallStart := trustclock.Now(), time.Now()
	g, err := d.Acquire(ctx, resource, "after a suspend", ttl)
	if err != nil {
		t.Fatal(err)
	}
	id, remaining := ownerLease(t, d, resource)
	since := trustclock.Now() - start
	if id == pooled {
		t.Fatalf("the acquisition took etcd lease %x from the pool after a suspend of %v, longer than its headroom", id, suspend)
	}
	for _, l := range before.Leases {
		if l.ID == id {
			t.Fatalf("the acquisition used etcd lease %x, granted before the suspend", id)
		}
	}
	// TimeToLive truncates to whole seconds: at least the TTL from the start means at least
	// the truncated rest of it now.
	if want := int64((ttl - since) / time.Second); remaining < want {
		t.Fatalf("etcd lease %x has %d s left, less than the TTL %v from the acquisition's start %v ago", id, remaining, ttl, since)
	}
	if g.LeaseUntil.Before(wallStart.Add(ttl)) {
		t.Fatalf("reported until %v is %v after the acquisition's start, less than the TTL %v", g.LeaseUntil, g.LeaseUntil.Sub(wallStart), ttl)
	}
}
