package etcd

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fewer round trips. An acquisition used to cost a read, a lease grant and the deciding Txn,
// and a release its Txn and a revocation. Now:
//
//   - The deciding Txn starts from the last snapshot this driver saw of the resource (cached
//     after its own acquisitions) instead of a fresh read. The Txn still pins that snapshot
//     with its compares (gen's mod revision, the epoch, the owner key's absence), so a stale
//     snapshot only makes the Txn fail, and its Else branch returns the fresh one to retry
//     from, exactly as after a race today: etcd decides, never the cache.
//   - The etcd lease is granted ahead of need, in the background, and taken from a pool kept
//     per TTL. An etcd lease's TTL runs from its grant and cannot be changed, so a lease
//     granted ahead is granted one second longer than the acquisition's TTL (rounded up to
//     seconds, as always) and is used only within aheadFresh (one second) of the moment its
//     grant request was sent, on the local monotonic clock. etcd expires it no earlier than
//     grant + TTL + 1 s >= (the acquisition's start - 1 s) + TTL + 1 s: never before the end
//     of the holder's trust window, which runs from the acquisition's start. Granted is
//     reported as (grant sent) + granted TTL, an underestimate of etcd's expiry, as before.
//     A lease that was sent in a Txn whose outcome is unknown is never put back: the
//     acquisition may have attached the owner key to it.
//   - Revocations after a release run in the background (Close waits for them). They were
//     already cleanup: the released owner key is gone, and a lease no key uses expires on
//     its own.

// aheadFresh is how long after its grant was sent a lease granted ahead may be used; the lease
// is granted this much longer than asked (etcd's TTL is in whole seconds).
const aheadFresh = time.Second

// maxAhead bounds the leases kept ready per TTL, and the cached snapshots.
const (
	maxAhead    = 16
	maxSnapshot = 4096
)

type aheadLease struct {
	id   clientv3.LeaseID
	ttl  int64     // seconds, as granted
	sent time.Time // when the grant request was sent (monotonic)
}

// ahead is a driver's state for the fast path.
type ahead struct {
	mu      sync.Mutex
	closed  bool
	leases  map[int64][]aheadLease // by requested TTL in seconds (before the extra second)
	pending map[int64]int          // grants in flight, by the same key
	snaps   map[string]leaseSnapshot
	bg      sync.WaitGroup
	// granted, set only by tests, is told of each lease granted ahead; anyAge, the mutation
	// that the freshness test must catch, uses leases granted ahead however old.
	granted func()
	anyAge  bool
}

// takeLease returns a lease granted ahead for ttl that is still fresh, and asks for one more.
func (d *Driver) takeLease(ttl time.Duration) (aheadLease, bool) {
	key := ttlSeconds(ttl)
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return aheadLease{}, false
	}
	d.refillLocked(key)
	list := a.leases[key]
	for len(list) > 0 {
		l := list[len(list)-1] // the newest
		list = list[:len(list)-1]
		if time.Since(l.sent) < aheadFresh || a.anyAge {
			a.leases[key] = list
			return l, true
		}
		// Too old to be used: every older one is too. They expire on their own, unused.
		list = list[:0]
	}
	a.leases[key] = list
	return aheadLease{}, false
}

// putBack returns an unused lease (its Txn certainly did not attach anything to it).
func (d *Driver) putBack(key int64, l aheadLease) {
	a := &d.ahead
	a.mu.Lock()
	if !a.closed && len(a.leases[key]) < maxAhead {
		a.leases[key] = append(a.leases[key], l)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	d.revokeLater(l.id)
}

// refillLocked grants one lease for key in the background unless enough are ready or coming.
func (d *Driver) refillLocked(key int64) {
	a := &d.ahead
	if a.leases == nil {
		a.leases, a.pending = map[int64][]aheadLease{}, map[int64]int{}
	}
	if len(a.leases[key])+a.pending[key] >= maxAhead {
		return
	}
	a.pending[key]++
	a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		sent := time.Now()
		resp, err := d.cli.Grant(ctx, key+int64(aheadFresh/time.Second))
		a.mu.Lock()
		a.pending[key]--
		kept := err == nil && !a.closed && len(a.leases[key]) < maxAhead
		if kept {
			a.leases[key] = append(a.leases[key], aheadLease{id: resp.ID, ttl: resp.TTL, sent: sent})
		}
		hook := a.granted
		a.mu.Unlock()
		if err == nil && !kept {
			_, _ = d.cli.Revoke(ctx, resp.ID)
		}
		if hook != nil {
			hook()
		}
	})
}

// revokeLater revokes an etcd lease that no key uses, in the background; after Close, at once
// (Close no longer waits for background work then).
func (d *Driver) revokeLater(id clientv3.LeaseID) {
	if d.skipRevoke {
		return
	}
	a := &d.ahead
	a.mu.Lock()
	if !a.closed {
		a.bg.Go(func() { d.revoke(context.Background(), id) })
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	d.revoke(context.Background(), id)
}

// snapshot returns the cached snapshot of a resource.
func (d *Driver) snapshot(resource string) (leaseSnapshot, bool) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.snaps[resource]
	return s, ok
}

// remember caches what an acquisition of this driver wrote: the gen key at its new revision,
// and no owner, which is what the next acquisition will want to find (if the lease is still
// held then, the Txn's owner compare fails and etcd's Else answers).
func (d *Driver) remember(resource string, epoch, gen, revision int64) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.snaps == nil || len(a.snaps) >= maxSnapshot {
		a.snaps = map[string]leaseSnapshot{}
	}
	a.snaps[resource] = leaseSnapshot{
		gen:   &kvPair{value: []byte(encodeToken(epoch, gen)), modRevision: revision},
		epoch: &kvPair{value: []byte(encodeGen(epoch))},
	}
}

// forget drops a cached snapshot that etcd contradicted.
func (d *Driver) forget(resource string) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.snaps, resource)
}

// closeAhead stops granting ahead, waits for the background work and revokes the leases
// granted ahead.
func (d *Driver) closeAhead() {
	a := &d.ahead
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.bg.Wait()
	a.mu.Lock()
	leases := a.leases
	a.leases = nil
	a.mu.Unlock()
	for _, list := range leases {
		for _, l := range list {
			d.revoke(context.Background(), l.id)
		}
	}
}
