package etcd

import (
	"context"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/internal/trustclock"
)

// Fewer round trips. An acquisition used to cost a read, a lease grant and the deciding Txn,
// and a release its Txn and a revocation. Now:
//
//   - The deciding Txn starts from the last snapshot this driver saw of the resource (cached
//     after its own releases) instead of a fresh read. The Txn still pins that snapshot
//     with its compares (gen's mod revision and the epoch; see acquireCompares), so a stale
//     snapshot only makes the Txn fail, and the acquisition reads a fresh one to retry
//     from, exactly as after a race: etcd decides, never the cache.
//   - The etcd lease is granted ahead of need, in the background, and taken from a pool kept
//     per granted TTL. An etcd lease's TTL runs from its grant (or its last keepalive) and
//     cannot be changed, and etcd's TTLs are whole seconds, so an acquisition may use a lease
//     of the pool only inside a window of its life where both of these hold, on the trust
//     window's clock (internal/trustclock), for the acquisition's TTL ttl and the lease's
//     granted TTL T, with S and R the moments the grant (or keepalive) request was sent and
//     its answer received:
//
//       safety:  S + T - ttl > now             etcd expires it no earlier than S + T, so never
//                                              before the end of a trust window that starts
//                                              at or after now (the acquisition's start);
//       bound:   R + T - ttl - B <= now        etcd expires it no later than R + T, so at
//                                              most B after now + ttl, and now is before the
//                                              deciding Txn is sent;
//
//     B is Options.AheadBound (1 s unless set). A lease is granted with T = ttl + B rounded
//     up to seconds, so that the window, B - (R - S) wide, opens before the lease's end; a
//     lease whose window passed
//     unused gets a keepalive, which starts its life again (S and R of the keepalive), and
//     serves again a window later. The clock counts a suspend of the machine, as etcd's
//     server does while the client sleeps, and as the holder's trust window does: Go's
//     monotonic clock, which the pool read before, stops during a suspend on Linux, so a
//     window stayed open across one and an acquisition took a lease that etcd could expire
//     before its start + TTL, inside the holder's trust window (docs/INVARIANTS.md, invariant
//     11; TestPooledLeaseAfterASuspend). So an etcd lease granted ahead outlives the acquisition's
//     start + TTL by at most B, plus the delay with which etcd itself revokes an expired
//     lease (its lessor looks for them every 500 ms); an etcd lease granted during the
//     acquisition (when no lease of the pool is in its window) is rounded up to whole
//     seconds, as always, and outlives start + TTL by at most that rounding plus the grant's
//     round trip. Granted is reported as S + T, an underestimate of etcd's expiry.
//     TestLeaseGrantedAheadWindow checks both sides and TestCrashedHolderHandover the
//     handover after a holder vanishes.
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

// maxAhead bounds the leases kept per granted TTL (ready, in use or coming): a lease is in its
// window about a tenth of the time, so sixteen holders need more than a hundred. maxSnapshot
// bounds the cached snapshots.
const (
	maxAhead    = 256
	maxSnapshot = 4096
)

type aheadLease struct {
	id         clientv3.LeaseID
	key        int64         // the pool: the TTL asked of etcd, in seconds
	ttl        int64         // seconds, as granted
	sent, recv time.Duration // the last grant or keepalive: request sent, answer received (trustclock.Now)
	sentWall   time.Time     // the wall clock at sent, for the LeaseUntil reported (informational)
	refreshing bool          // a keepalive is on its way
	bound      time.Duration // the driver's Options.AheadBound
}

// aheadSeconds is the TTL asked of etcd for a lease granted ahead of acquisitions of ttl.
func aheadSeconds(ttl, bound time.Duration) int64 { return ttlSeconds(ttl + bound) }

// window is when an acquisition of ttl may use the lease, on trustclock: from opens
// (included) to closes.
func (l aheadLease) window(ttl time.Duration) (opens, closes time.Duration) {
	life := time.Duration(l.ttl)*time.Second - ttl
	return l.recv + life - l.bound, l.sent + life
}

// usable tells whether an acquisition of ttl starting now (trustclock.Now) may use the lease;
// anyTime is the mutation that the window tests must catch.
func (l aheadLease) usable(ttl, now time.Duration, anyTime bool) bool {
	opens, closes := l.window(ttl)
	return anyTime && now < l.ends() || now >= opens && now < closes
}

// ends is the earliest moment etcd may expire the lease, on trustclock.
func (l aheadLease) ends() time.Duration { return l.sent + time.Duration(l.ttl)*time.Second }

// expired tells whether etcd may have expired the lease by now (trustclock.Now): nothing can
// use it any more.
func (l aheadLease) expired(now time.Duration) bool { return now >= l.ends() }

// ahead is a driver's state for the fast path.
type ahead struct {
	bound   time.Duration // Options.AheadBound; negative: nothing granted ahead
	mu      sync.Mutex
	closed  bool
	leases  map[int64][]aheadLease          // by requested TTL in seconds (before the extra second)
	pending map[int64]int                   // grants in flight, by the same key
	inUse   map[clientv3.LeaseID]aheadLease // taken from the pool by an acquisition
	snaps   map[string]cachedSnapshot
	held    map[string]heldEntry // gen values this driver wrote for leases it holds (holderTxn)
	reuse   reusePool            // released leases kept alive for the next acquisitions (reuse.go)
	bg      sync.WaitGroup
	// The tender (tend) keeps windows open: demand by key, the TTL last asked for, the last
	// acquisition that took or missed a lease, and whether it runs.
	demand  map[int64]*aheadDemand
	tending bool
	stop    chan struct{}
	// granted, set only by tests, is told of each lease granted ahead (or kept alive); anyTime,
	// the mutation that the window tests must catch, uses a lease of the pool outside its
	// window; manual, for tests that follow one lease, turns the tender off (a lease whose
	// window passed is then kept alive when an acquisition finds it so).
	granted func()
	anyTime bool
	manual  bool
}

// aheadDemand is what the tender knows of the acquisitions of one key since its last tick.
type aheadDemand struct {
	ttl      time.Duration
	peak     int           // most leases of the key in use at once
	misses   int           // acquisitions that found no lease in its window
	lastUsed time.Duration // trustclock.Now
}

// The tender. A lease serves a window of about the bound per second of its life, so a pool
// kept alive only when acquisitions find its leases past their windows would see them start
// their lives again together and be ready together, for the bound out of every second.
// Instead, every tick (four fifths of the bound), the tender starts the life of as many leases
// as the acquisitions of the last tick needed (most in use at once, plus those that found none
// up to as many again, plus two), choosing those whose windows passed longest ago and granting
// more when too few are left: windows a little longer than a tick then open a tick apart, so
// that about that many leases are in their window at any moment. It stops after aheadIdle
// without acquisitions.
const aheadIdle = 2 * time.Second

// tend runs the tender until it has nothing to do or the driver closes.
func (d *Driver) tend(stop <-chan struct{}) {
	t := time.NewTicker(max(d.ahead.bound*4/5, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !d.tick() {
			return
		}
	}
}

// tick is one round of the tender; false when it stopped.
func (d *Driver) tick() bool {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.leases == nil {
		a.tending = false
		return false
	}
	now := trustclock.Now()
	for key, dem := range a.demand {
		if now-dem.lastUsed > aheadIdle {
			delete(a.demand, key)
			continue
		}
		need := dem.peak + min(dem.misses, dem.peak) + 2
		dem.misses, dem.peak = 0, 0
		for _, l := range a.inUse {
			if l.key == key {
				dem.peak++
			}
		}
		list := a.leases[key][:0]
		var passed []int
		for _, l := range a.leases[key] {
			if !l.refreshing && l.expired(now) {
				continue
			}
			if _, closes := l.window(dem.ttl); !l.refreshing && now >= closes {
				passed = append(passed, len(list))
			}
			list = append(list, l)
		}
		a.leases[key] = list
		sort.Slice(passed, func(i, j int) bool { return list[passed[i]].sent < list[passed[j]].sent })
		for _, i := range passed[:min(need, len(passed))] {
			list[i].refreshing = true
			d.keepAliveLocked(list[i].id)
		}
		for range need - min(need, len(passed)) {
			d.refillLocked(key)
		}
	}
	if len(a.demand) == 0 || a.closed {
		a.tending = false
		return false
	}
	return true
}

// wantLocked records an acquisition's demand for key and starts the tender if it is not running.
func (d *Driver) wantLocked(key int64, ttl time.Duration, missed bool, now time.Duration) {
	a := &d.ahead
	if a.demand == nil {
		a.demand = map[int64]*aheadDemand{}
	}
	dem := a.demand[key]
	if dem == nil {
		dem = &aheadDemand{}
		a.demand[key] = dem
	}
	dem.ttl, dem.lastUsed = ttl, now
	if missed {
		dem.misses++
	}
	if a.tending || a.manual || a.closed {
		return
	}
	if a.stop == nil {
		a.stop = make(chan struct{})
	}
	a.tending = true
	stop := a.stop
	a.bg.Go(func() { d.tend(stop) })
}

// takeLease returns a lease of the pool for ttl that is in its window (see above), drops those
// etcd may have expired, grants one more ahead when none is in its window (unless a grant is
// on its way), and tells the tender what it found. Without the tender (tests), it sends a
// keepalive to every lease whose window has passed, so that it serves again a window later.
func (d *Driver) takeLease(ttl time.Duration) (aheadLease, bool) {
	a := &d.ahead
	key := aheadSeconds(ttl, a.bound)
	now := trustclock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.bound < 0 {
		return aheadLease{}, false
	}
	if a.leases == nil {
		a.leases, a.pending, a.inUse = map[int64][]aheadLease{}, map[int64]int{}, map[clientv3.LeaseID]aheadLease{}
	}
	for id, l := range a.inUse {
		if l.expired(now) {
			delete(a.inUse, id) // can no longer go back to the pool
		}
	}
	list := a.leases[key][:0]
	best := -1
	for _, l := range a.leases[key] {
		switch _, closes := l.window(ttl); {
		case l.refreshing:
		case l.usable(ttl, now, a.anyTime):
			if best < 0 {
				best = len(list)
			}
		case l.expired(now):
			continue
		case a.manual && now >= closes:
			l.refreshing = true
			d.keepAliveLocked(l.id)
		}
		list = append(list, l)
	}
	var l aheadLease
	if best >= 0 {
		l = list[best]
		list = append(list[:best], list[best+1:]...)
		a.inUse[l.id] = l
	}
	a.leases[key] = list
	if best < 0 && a.pending[key] == 0 {
		d.refillLocked(key) // one at a time: the tender grants the rest
	}
	d.wantLocked(key, ttl, best < 0, now)
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
// there and etcd cannot have expired it yet, into the reuse pool if an acquisition granted or
// reused it (reuse.go), otherwise it is revoked in the background.
func (d *Driver) released(id clientv3.LeaseID) {
	a := &d.ahead
	a.mu.Lock()
	l, ok := a.inUse[id]
	delete(a.inUse, id)
	if ok && !a.closed && !l.expired(trustclock.Now()) && len(a.leases[l.key]) < maxAhead {
		a.leases[l.key] = append(a.leases[l.key], l)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if o, owned := d.ownedLeaseOf(id); owned && !ok {
		d.releasedOwned(o)
		return
	}
	d.revokeLater(id)
}

// count is the number of leases for key that are ready, in use or coming.
func (a *ahead) count(key int64) int {
	n := len(a.leases[key]) + a.pending[key]
	for _, l := range a.inUse {
		if l.key == key {
			n++
		}
	}
	return n
}

// refillLocked grants one lease for key in the background unless enough are ready or coming.
func (d *Driver) refillLocked(key int64) {
	a := &d.ahead
	if a.count(key) >= maxAhead {
		return
	}
	a.pending[key]++
	a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(d.cli.Ctx(), cleanupTimeout) // ends when the client closes
		defer cancel()
		sent, sentWall := trustclock.Now(), time.Now()
		resp, err := d.cli.Grant(ctx, key)
		recv := trustclock.Now()
		a.mu.Lock()
		a.pending[key]--
		kept := err == nil && !a.closed && len(a.leases[key]) < maxAhead
		if kept {
			a.leases[key] = append(a.leases[key], aheadLease{id: resp.ID, key: key, ttl: resp.TTL, sent: sent, recv: recv, sentWall: sentWall, bound: a.bound})
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

// keepAliveLocked starts the life of a lease of the pool again, in the background. The lease
// carries no key (it is in the pool, not in use), so keeping it alive lengthens nobody's lease.
// A lease etcd no longer knows leaves the pool.
func (d *Driver) keepAliveLocked(id clientv3.LeaseID) {
	a := &d.ahead
	a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(d.cli.Ctx(), cleanupTimeout) // ends when the client closes
		defer cancel()
		sent, sentWall := trustclock.Now(), time.Now()
		resp, err := d.cli.KeepAliveOnce(ctx, id)
		recv := trustclock.Now()
		a.mu.Lock()
		for key, list := range a.leases {
			for i := range list {
				if list[i].id != id {
					continue
				}
				if err != nil || resp.TTL <= 0 {
					a.leases[key] = append(list[:i], list[i+1:]...)
				} else {
					list[i].sent, list[i].recv, list[i].sentWall, list[i].ttl, list[i].refreshing = sent, recv, sentWall, resp.TTL, false
				}
				break
			}
		}
		hook := a.granted
		a.mu.Unlock()
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
	c, ok := a.snaps[resource]
	a.mu.Unlock()
	if !ok {
		return leaseSnapshot{}, false
	}
	return leaseSnapshot{
		gen:   &kvPair{value: appendGen(appendGen(make([]byte, 0, 2*genWidth), c.epoch), c.gen), modRevision: c.revision},
		epoch: &kvPair{value: appendGen(make([]byte, 0, genWidth), c.epoch)},
	}, true
}

// cachedSnapshot is what remember keeps of a resource; snapshot builds the leaseSnapshot from
// it when an acquisition wants it, so that a release caches without allocating.
type cachedSnapshot struct{ epoch, gen, revision int64 }

// remember caches what a release of this driver wrote: the gen key at the release's revision,
// and no owner, which is what the next acquisition wants to find. Only a release (or a
// publish-and-release) caches: the acquisition's Txn pins the snapshot by gen's mod revision
// and the epoch alone, so a snapshot of a held resource without its owner must never be
// cached (see Acquire, acquireCompares).
func (d *Driver) remember(resource string, epoch, gen, revision int64) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.snaps == nil || len(a.snaps) >= maxSnapshot {
		a.snaps = map[string]cachedSnapshot{}
	}
	a.snaps[resource] = cachedSnapshot{epoch: epoch, gen: gen, revision: revision}
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
	if a.stop != nil && !a.closed { // Close may be called twice
		close(a.stop)
	}
	a.closed = true
	a.mu.Unlock()
	a.bg.Wait()
	a.mu.Lock()
	leases := a.leases
	a.leases = nil
	a.mu.Unlock()
	if idle := d.closeReuse(); len(idle) > 0 {
		if leases == nil {
			leases = map[int64][]aheadLease{}
		}
		for _, id := range idle { // the reuse pool's (reuse.go), under a key no TTL has
			leases[0] = append(leases[0], aheadLease{id: id})
		}
	}
	// The pool may hold a few hundred leases: revoked sixteen at a time.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, list := range leases {
		for _, l := range list {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				d.revoke(context.Background(), l.id)
			})
		}
	}
	wg.Wait()
}
