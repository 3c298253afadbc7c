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
//   - Such a lease serves one acquisition at a time. When a release (or a publication that
//     releases) deletes the owner key in its Txn, the etcd lease that key was on has no key
//     left and, if it came from the pool and is still within aheadFresh of its grant, goes
//     back to the pool for this driver's next acquisition, instead of being revoked while
//     another is granted. A lease whose acquisition's outcome is unknown never goes back
//     (the owner key may be on it), nor one that a renewal moved the key away from (the
//     renewal revokes it). So an etcd lease may carry the owner keys of several generations
//     one after the other, never two at once; nothing in this package sends keepalives, and
//     a keepalive sent by anyone else on a lease could only lengthen the current holder's
//     lease, never make an earlier generation's Txns match again (they compare the token).
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
	key  int64     // the pool: the requested TTL in seconds (before the extra second)
	ttl  int64     // seconds, as granted
	sent time.Time // when the grant request was sent (monotonic)
}

func (l aheadLease) fresh() bool { return time.Since(l.sent) < aheadFresh }

// ahead is a driver's state for the fast path.
type ahead struct {
	mu      sync.Mutex
	closed  bool
	leases  map[int64][]aheadLease          // by requested TTL in seconds (before the extra second)
	pending map[int64]int                   // grants in flight, by the same key
	inUse   map[clientv3.LeaseID]aheadLease // taken from the pool by an acquisition
	snaps   map[string]leaseSnapshot
	bg      sync.WaitGroup
	// granted, set only by tests, is told of each lease granted ahead; anyAge, the mutation
	// that the freshness test must catch, uses leases granted ahead however old.
	granted func()
	anyAge  bool
}

// takeLease returns the freshest lease of the pool for ttl, and asks for one more when too few
// are younger than half of aheadFresh. Leases too old to be used are dropped; they expire
// on their own, unused.
func (d *Driver) takeLease(ttl time.Duration) (aheadLease, bool) {
	key := ttlSeconds(ttl)
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return aheadLease{}, false
	}
	if a.leases == nil {
		a.leases, a.pending, a.inUse = map[int64][]aheadLease{}, map[int64]int{}, map[clientv3.LeaseID]aheadLease{}
	}
	for id, l := range a.inUse {
		if !l.fresh() {
			delete(a.inUse, id) // can no longer go back to the pool
		}
	}
	list := a.leases[key][:0]
	best := -1
	for _, l := range a.leases[key] {
		if l.fresh() || a.anyAge {
			list = append(list, l)
			if best < 0 || l.sent.After(list[best].sent) {
				best = len(list) - 1
			}
		}
	}
	var l aheadLease
	if best >= 0 {
		l = list[best]
		list = append(list[:best], list[best+1:]...)
		a.inUse[l.id] = l
	}
	a.leases[key] = list
	// Keep more young leases (in the pool, in use, or coming) than there are acquisitions
	// holding one, so that the next acquisition finds one even when every holder is still
	// holding; one grant per call at most.
	young, held := a.pending[key], 0
	for _, r := range list {
		if time.Since(r.sent) < aheadFresh/2 {
			young++
		}
	}
	for _, r := range a.inUse {
		if r.key == key {
			held++
			if time.Since(r.sent) < aheadFresh/2 {
				young++
			}
		}
	}
	if young <= held {
		d.refillLocked(key)
	}
	return l, best >= 0
}

// putBack returns a lease whose acquisition certainly did not happen.
func (d *Driver) putBack(l aheadLease) { d.released(l.id) }

// leaseOutcomeUnknown keeps a lease out of the pool for good: the owner key may be on it.
func (d *Driver) leaseOutcomeUnknown(id clientv3.LeaseID) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.inUse, id)
}

// released takes back an etcd lease that no key uses any more: into the pool if it came from
// there and is still fresh, otherwise it is revoked in the background.
func (d *Driver) released(id clientv3.LeaseID) {
	a := &d.ahead
	a.mu.Lock()
	l, ok := a.inUse[id]
	delete(a.inUse, id)
	if ok && !a.closed && (l.fresh() || a.anyAge) && len(a.leases[l.key]) < maxAhead {
		a.leases[l.key] = append(a.leases[l.key], l)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	d.revokeLater(id)
}

// refillLocked grants one lease for key in the background unless enough are ready or coming.
func (d *Driver) refillLocked(key int64) {
	a := &d.ahead
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
			a.leases[key] = append(a.leases[key], aheadLease{id: resp.ID, key: key, ttl: resp.TTL, sent: sent})
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
