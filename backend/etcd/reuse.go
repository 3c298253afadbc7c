package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/internal/trustclock"
)

// Reusing etcd leases. A lease granted ahead (ahead.go) serves only inside a window of its life;
// outside it an acquisition used to grant a lease of its own and the release revoke it: two
// Raft writes per acquisition besides its Txn and the release's. Now an etcd lease that
// carried an acquisition's owner key is kept after a release CONFIRMED that the key is gone
// (the release Txn, or a publication that releases, succeeded and deleted the owner key in the
// same Txn), in a pool per requested TTL, and the next acquisition that finds no lease of
// ahead.go in its window takes it and sends it one keepalive (LeaseKeepAliveOnce) before its
// Txn. A keepalive is answered by the leader's lessor without a Raft proposal (etcd 3.5 and
// later; with --experimental-enable-lease-checkpoint-persist it writes a checkpoint only for a
// lease that has a remaining TTL recorded, at most twice per checkpoint interval), and it starts
// the lease's life again: etcd now expires it no earlier than S + T and no later than R + T,
// for the keepalive's request S, its answer R and the lease's granted TTL T, which is the
// acquisition's TTL rounded up to whole seconds, as for a lease granted during the
// acquisition. The acquisition starts before S and its Txn is sent after R, so the lease
// lasts at least the TTL from the acquisition's start and outlives the Txn by at most the
// rounding: exactly the bounds of a lease granted during the acquisition. Grant reports
// LeaseUntil as S + T. The pool's times are read on the trust window's clock
// (internal/trustclock), which counts a suspend of the machine as etcd's server does, so that
// a lease whose life a suspend ended is dropped rather than kept alive in vain.
//
// Expiry stays etcd's decision: the owner key is put with the lease, and etcd deletes it when
// the lease runs out. The schedules this has to get right (reuse_test.go forces each):
//
//   - A pooled lease that etcd expired (or that anyone revoked) answers the keepalive with
//     "not found" (or a TTL of 0): it leaves the pool, nothing is attached to it, and the next
//     pooled lease is tried, then a fresh grant.
//   - The keepalive is answered and the lease expires before the Txn reaches etcd (the
//     acquisition paused longer than the TTL between the two): etcd refuses the whole Txn,
//     since a put with a lease that does not exist is rejected before anything is applied
//     (ErrLeaseNotFound, not applied). The acquisition then grants a fresh lease and sends
//     its Txn again from the same snapshot; it is neither an error nor a grant.
//   - A release whose outcome is unknown (its reply was lost), or that was refused, never
//     returns the lease to the pool: the owner key may still be on it, and a keepalive would
//     lengthen a lease that is someone's. Such a lease is forgotten and expires on its own.
//     So is the lease of an acquisition whose outcome is unknown, and one that a renewal moved
//     the owner key away from (the renewal revokes it).
//
// An etcd lease therefore carries at most one owner key at any moment, like a lease of ahead.go.
// A lease idle in the pool is dropped (not revoked: it carries no key, and etcd expires it)
// once its life since the last grant or keepalive is within reuseMargin of its end, so that
// no keepalive is wasted on a lease etcd is about to expire; Close revokes what is left.
// Options.DisableLeaseReuse turns the pool off (each lease granted during an acquisition is
// revoked after its release, as before).

// reuseMargin: a pooled lease within this of its end (on trustclock, from the request of its
// last grant or keepalive) is dropped rather than kept alive.
const reuseMargin = 250 * time.Millisecond

// ownedLease is an etcd lease that an acquisition granted or took from the reuse pool, while it
// may carry that acquisition's owner key.
type ownedLease struct {
	id              clientv3.LeaseID
	key             int64         // the TTL asked of etcd, in seconds: the pool it returns to
	ttl             int64         // seconds, as granted (etcd may raise a small TTL)
	sent            time.Duration // the request of the last grant or keepalive (trustclock.Now)
	sentWall        time.Time     // the wall clock at sent, for the LeaseUntil reported (informational)
	resource, owner string        // the acquisition that put its owner key on it
}

// ends is the earliest moment etcd may expire the lease, on trustclock.
func (l ownedLease) ends() time.Duration { return l.sent + time.Duration(l.ttl)*time.Second }

// reusePool is the driver's state for reuse; it shares ahead's mutex.
type reusePool struct {
	idle  map[int64][]ownedLease          // released, by requested TTL in seconds
	owned map[clientv3.LeaseID]ownedLease // granted or reused by an acquisition, not yet released
	// Test hooks and mutations, set only by tests: beforeTxn runs between the lease's
	// keepalive (or grant) and the acquisition's Txn; keepUnconfirmed pools the lease of a
	// release whose outcome is unknown, retryGone makes a lease gone before the Txn an
	// error, noRefresh skips the keepalive: each a mutation that reuse_test.go must catch.
	beforeTxn       func(clientv3.LeaseID)
	keepUnconfirmed bool
	goneIsError     bool
	noRefresh       bool
}

// acquisitionLease returns an etcd lease for an acquisition of ttl that found none of ahead.go
// in its window: a released one from the pool, kept alive once, else a fresh grant. Its
// error is not applied: nothing of the resource has changed.
func (d *Driver) acquisitionLease(ctx context.Context, ttl time.Duration, resource, owner string) (ownedLease, error) {
	key := ttlSeconds(ttl)
	for {
		l, ok := d.takeIdle(key)
		if !ok {
			break
		}
		sent, sentWall := trustclock.Now(), time.Now()
		if d.ahead.reuse.noRefresh {
			return d.own(l, resource, owner), nil
		}
		resp, err := d.cli.KeepAliveOnce(ctx, l.id)
		switch {
		case err == nil && resp.TTL > 0 && time.Duration(resp.TTL)*time.Second >= ttl:
			l.ttl, l.sent, l.sentWall = resp.TTL, sent, sentWall
			return d.own(l, resource, owner), nil
		case (err == nil || leaseGone(err)) && !d.ahead.reuse.goneIsError:
			// etcd expired it (or someone revoked it): it carries nothing; try the next.
			continue
		default:
			// The keepalive itself failed (the context ended, no connection): the lease
			// carries no key, so it may go back to the pool, where its age decides.
			d.releasedOwned(l)
			return ownedLease{}, fmt.Errorf("keep etcd lease alive: %w", err)
		}
	}
	return d.grantOwned(ctx, ttl, resource, owner)
}

// grantOwned grants a lease for one acquisition.
func (d *Driver) grantOwned(ctx context.Context, ttl time.Duration, resource, owner string) (ownedLease, error) {
	sent, sentWall := trustclock.Now(), time.Now()
	resp, err := d.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return ownedLease{}, fmt.Errorf("grant etcd lease: %w", err)
	}
	return d.own(ownedLease{id: resp.ID, key: ttlSeconds(ttl), ttl: resp.TTL, sent: sent, sentWall: sentWall}, resource, owner), nil
}

// own records the lease as an acquisition's.
func (d *Driver) own(l ownedLease, resource, owner string) ownedLease {
	l.resource, l.owner = resource, owner
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reuse.owned == nil {
		a.reuse.owned = map[clientv3.LeaseID]ownedLease{}
	}
	a.reuse.owned[l.id] = l
	return l
}

// takeIdle takes a released lease for key from the pool, dropping those near their end.
func (d *Driver) takeIdle(key int64) (ownedLease, bool) {
	a := &d.ahead
	now := trustclock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	list := a.reuse.idle[key]
	for len(list) > 0 {
		l := list[len(list)-1] // the most recently released: the longest life left
		list = list[:len(list)-1]
		if now+reuseMargin < l.ends() {
			a.reuse.idle[key] = list
			return l, true
		}
	}
	delete(a.reuse.idle, key)
	return ownedLease{}, false
}

// releasedOwned takes back an owned lease that certainly carries no key: into the pool unless
// reuse is off, the driver closed, or etcd may expire it soon; else it is revoked in the
// background (a lease near its end is left to expire).
func (d *Driver) releasedOwned(l ownedLease) {
	a := &d.ahead
	now := trustclock.Now()
	a.mu.Lock()
	delete(a.reuse.owned, l.id)
	if !a.closed && !d.noReuse && now+reuseMargin < l.ends() && len(a.reuse.idle[l.key]) < maxAhead {
		if a.reuse.idle == nil {
			a.reuse.idle = map[int64][]ownedLease{}
		}
		a.reuse.idle[l.key] = append(a.reuse.idle[l.key], l)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if now < l.ends() {
		d.revokeLater(l.id)
	}
}

// ownedLeaseOf returns the owned lease with the id, dropping owned leases that etcd has
// certainly expired (their release never came).
func (d *Driver) ownedLeaseOf(id clientv3.LeaseID) (ownedLease, bool) {
	a := &d.ahead
	now := trustclock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for other, l := range a.reuse.owned {
		if now >= l.ends() && other != id {
			delete(a.reuse.owned, other)
		}
	}
	l, ok := a.reuse.owned[id]
	return l, ok
}

// forgetOwned drops an owned lease for good: the owner key may be on it (an unknown outcome),
// or a renewal moved the key away and revokes it.
func (d *Driver) forgetOwned(id clientv3.LeaseID) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.reuse.owned, id)
}

// releaseUnconfirmed is told of a release (or a publication that releases) of the resource by
// owner whose outcome is not a confirmed deletion of the owner key: an unknown outcome or a
// refusal. The owner key may still be on the acquisition's lease, so that lease never returns
// to the pool.
func (d *Driver) releaseUnconfirmed(resource, owner string) {
	a := &d.ahead
	a.mu.Lock()
	var found []ownedLease
	for id, l := range a.reuse.owned {
		if l.resource == resource && l.owner == owner {
			delete(a.reuse.owned, id)
			found = append(found, l)
		}
	}
	mutant := a.reuse.keepUnconfirmed
	a.mu.Unlock()
	if mutant {
		for _, l := range found {
			d.releasedOwned(l)
		}
	}
}

// leaseGone tells whether etcd refused a request because the etcd lease it names no longer
// exists: the request was rejected as a whole (not applied).
func leaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// closeReuse empties the pool and returns the idle leases, for Close to revoke.
func (d *Driver) closeReuse() []clientv3.LeaseID {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []clientv3.LeaseID
	for _, list := range a.reuse.idle {
		for _, l := range list {
			ids = append(ids, l.id)
		}
	}
	a.reuse.idle = nil
	return ids
}
