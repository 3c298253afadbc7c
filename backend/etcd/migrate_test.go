package etcd

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

// TestMigrateFoldsVersion2: a store written in version 2's layout, by hand (a bumped epoch, a
// lease held on a live etcd lease, one expired, one released), is folded by Migrate: the
// holder and until keys are gone, the held lease is still held by its owner and can publish
// and release with the reference it had, the expired one can still be released, and a second
// Migrate changes nothing.
func TestMigrateFoldsVersion2(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: newPrefix()})
	t.Cleanup(func() { _ = d.Close() })
	const epoch = 1_764_000_000_123_456
	const (
		held     = "held ресурс\x00 one"
		expired  = "expired ресурс two"
		released = "released ресурс three"
		owner    = "owner ä ö"
	)
	until := time.Unix(0, 1_764_000_100_000_000_123).UTC()
	lease, err := d.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.cli.Revoke(ctx, lease.ID) })
	put := version2Store(t, d, epoch, map[string]int64{held: 5, expired: 7, released: 2}, map[string]string{held: owner, expired: owner}, until)
	put(d.keys(held).owner, owner, clientv3.WithLease(lease.ID))
	for i := range 20 { // more keys than one page of the fold's listing (pruneBatch)
		r := fmt.Sprintf("page %d ресурс", i)
		put(d.keys(r).gen, encodeToken(epoch, int64(i+1)))
		put(d.prefix+r+"/holder", owner)
		put(d.prefix+r+"/until", encodeTime(until))
	}

	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := d.cli.Get(ctx, d.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		if k := string(kv.Key); bytes.HasSuffix(kv.Key, []byte("/holder")) || bytes.HasSuffix(kv.Key, []byte("/until")) {
			t.Errorf("version 2 key %q left after Migrate", k)
		}
		if string(kv.Key) == d.schemaKey() && string(kv.Value) != "3" {
			t.Errorf("schema %q after Migrate, want 3", kv.Value)
		}
	}

	st, err := d.Read(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	if st.Owner != owner || st.Epoch != epoch || st.Generation != 5 || !st.LeaseUntil.Equal(until) || !st.Held() {
		t.Fatalf("held lease after Migrate: %+v", st)
	}
	if _, err := d.Acquire(ctx, held, "another", time.Minute); !errors.As(err, new(*driver.BusyError)) {
		t.Fatalf("acquire of the held lease after Migrate: %v, want busy", err)
	}
	ref := driver.LeaseRef{Resource: held, Owner: owner, Epoch: epoch, Generation: 5}
	payload := []byte("folded\x00payload")
	if ok, err := d.Publish(ctx, ref, driver.Publication{Payload: payload, OpID: "fold-1"}); !ok || err != nil {
		t.Fatalf("publish with the version 2 reference: %v, %v", ok, err)
	}
	if got, g, err := d.ReadPayload(ctx, held); err != nil || g != 5 || !bytes.Equal(got, payload) {
		t.Fatalf("payload %q at %d, %v", got, g, err)
	}
	if ok, err := d.Release(ctx, ref); !ok || err != nil {
		t.Fatalf("release with the version 2 reference: %v, %v", ok, err)
	}

	if st, err := d.Read(ctx, expired); err != nil || st.Owner != owner || st.Held() || st.Generation != 7 {
		t.Fatalf("expired lease after Migrate: %+v, %v", st, err)
	}
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: expired, Owner: owner, Epoch: epoch, Generation: 7}); !ok || err != nil {
		t.Fatalf("release of the expired lease: %v, %v", ok, err)
	}
	if st, err := d.Read(ctx, released); err != nil || st.Owner != "" || st.Held() || st.Generation != 2 {
		t.Fatalf("released lease after Migrate: %+v, %v", st, err)
	}
	if g, err := d.Acquire(ctx, released, owner, time.Minute); err != nil || g.Epoch != epoch || g.Generation != 3 {
		t.Fatalf("acquire after Migrate: %+v, %v", g, err)
	}
	if _, err := d.Acquire(ctx, expired, "a\x00b", time.Minute); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("acquire with a NUL in the owner: %v, want not applied", err)
	}

	before, err := d.cli.Get(ctx, d.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := d.cli.Get(ctx, d.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Kvs) != len(after.Kvs) {
		t.Fatalf("second Migrate: %d keys, then %d", len(before.Kvs), len(after.Kvs))
	}
	for i, kv := range after.Kvs {
		if kv.ModRevision != before.Kvs[i].ModRevision {
			t.Errorf("second Migrate changed %q", kv.Key)
		}
	}
}

// TestHolderComparePinsTheWholeOwner: the two compares of holderIs accept the owner that gen
// holds and no owner that is a prefix of it or extends it. Without the upper bound "owner ö"
// would release "owner ö x"'s lease; without the lower bound "owner ö x2" would. The releases
// go through a driver that did not acquire, which has no exact gen value to compare
// (holderTxn) and so sends holderIs's compares.
func TestHolderComparePinsTheWholeOwner(t *testing.T) {
	t.Parallel()
	const resource = "holder ресурс\x00"
	prefix := newPrefix()
	acquirer := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix})
	t.Cleanup(func() { _ = acquirer.Close() })
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix})
	t.Cleanup(func() { _ = d.Close() })
	prepare(t, acquirer, resource)
	ctx := testCtx(t)
	g, err := acquirer.Acquire(ctx, resource, "owner ö x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"owner ö", "owner ö ", "owner ö x2", "owner ö y", ""} {
		l := driver.LeaseRef{Resource: resource, Owner: other, Epoch: g.Epoch, Generation: g.Generation}
		if ok, err := d.Release(ctx, l); ok || err != nil {
			t.Errorf("release by %q: %v, %v", other, ok, err)
		}
	}
	l := driver.LeaseRef{Resource: resource, Owner: "owner ö x", Epoch: g.Epoch, Generation: g.Generation}
	if ok, err := d.Release(ctx, l); !ok || err != nil {
		t.Fatalf("release by the holder: %v, %v", ok, err)
	}
	if ok, err := d.Release(ctx, l); ok || err != nil {
		t.Fatalf("second release: %v, %v", ok, err)
	}
}

// version2Store writes a store in version 2's layout by hand: the epoch, schema "2", and for
// each resource its bare token at the generation given, pub and source, and the holder and
// until keys where holders names one. It returns its put for the test's own keys.
func version2Store(t *testing.T, d *Driver, epoch int64, gens map[string]int64, holders map[string]string, until time.Time) func(key, value string, opts ...clientv3.OpOption) {
	t.Helper()
	ctx := testCtx(t)
	put := func(key, value string, opts ...clientv3.OpOption) {
		t.Helper()
		if _, err := d.cli.Put(ctx, key, value, opts...); err != nil {
			t.Fatal(err)
		}
	}
	put(d.epochKey(), encodeGen(epoch))
	put(d.schemaKey(), "2")
	for r, g := range gens {
		k := d.keys(r)
		put(k.gen, encodeToken(epoch, g))
		put(k.pub, encodeGen(0))
		put(k.source, encodeGen(0))
		if h, ok := holders[r]; ok {
			put(d.prefix+r+"/holder", h)
			put(d.prefix+r+"/until", encodeTime(until))
		}
	}
	return put
}

// TestUnmigratedVersion2FailsClosed: a driver of this layout opened on a version 2 store that
// was never migrated (fenced.Config.SkipMigrate) refuses every operation before sending it,
// not applied, with an error naming fenced migrate, and writes nothing: without the check
// it would take the lease that a version 2 holder's expired etcd lease left (its holder key
// still there), read a held lease as having no owner, and leave a folded gen key beside
// version 2 holder keys. After Migrate the same driver works, and the held lease is its
// owner's.
func TestUnmigratedVersion2FailsClosed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: newPrefix()})
	t.Cleanup(func() { _ = d.Close() })
	const epoch = 1_764_000_000_654_321
	const (
		held    = "held ресурс\x00 v2"
		expired = "expired ресурс v2"
		free    = "free ресурс v2"
		owner   = "owner ä v2"
	)
	lease, err := d.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.cli.Revoke(ctx, lease.ID) })
	put := version2Store(t, d, epoch, map[string]int64{held: 5, expired: 7, free: 2},
		map[string]string{held: owner, expired: owner}, time.Unix(0, 1_764_000_100_000_000_321))
	put(d.keys(held).owner, owner, clientv3.WithLease(lease.ID))
	before, err := d.cli.Get(ctx, d.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}

	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrNotMigrated) || !errors.Is(err, driver.ErrNotApplied) || !strings.Contains(err.Error(), "fenced migrate") {
			t.Errorf("%s on an unmigrated version 2 store: %v, want not applied and ErrNotMigrated", what, err)
		}
	}
	ref := driver.LeaseRef{Resource: held, Owner: owner, Epoch: epoch, Generation: 5}
	for _, r := range []string{expired, free, held} {
		_, err := d.Acquire(ctx, r, "new owner ö", time.Minute)
		refused("acquire "+r, err)
	}
	_, err = d.Read(ctx, held)
	refused("read", err)
	_, err = d.Publish(ctx, ref, driver.Publication{Payload: []byte("stale\x00"), OpID: "v2-pub"})
	refused("publish", err)
	_, err = d.PublishAndRelease(ctx, ref, driver.Publication{Payload: []byte("stale\x00"), OpID: "v2-pub"})
	refused("publish and release", err)
	_, _, err = d.Renew(ctx, ref, time.Minute)
	refused("renew", err)
	_, err = d.Release(ctx, ref)
	refused("release", err)
	refused("provision", d.Provision(ctx, "another ресурс"))
	after, err := d.cli.Get(ctx, d.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Kvs) != len(before.Kvs) {
		t.Fatalf("the refused operations wrote: %d keys, then %d", len(before.Kvs), len(after.Kvs))
	}
	for i, kv := range after.Kvs {
		if kv.ModRevision != before.Kvs[i].ModRevision {
			t.Errorf("a refused operation wrote %q", kv.Key)
		}
	}

	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Read(ctx, held); err != nil || st.Owner != owner || !st.Held() || st.Generation != 5 {
		t.Fatalf("held lease after Migrate: %+v, %v", st, err)
	}
	if _, err := d.Acquire(ctx, held, "new owner ö", time.Minute); !errors.As(err, new(*driver.BusyError)) {
		t.Fatalf("acquire of the held lease after Migrate: %v, want busy", err)
	}
	if g, err := d.Acquire(ctx, expired, "new owner ö", time.Minute); err != nil || g.Generation != 8 || g.Epoch != epoch {
		t.Fatalf("acquire of the expired lease after Migrate: %+v, %v", g, err)
	}
	if ok, err := d.Release(ctx, ref); !ok || err != nil {
		t.Fatalf("release by the version 2 holder after Migrate: %v, %v", ok, err)
	}
}

// TestExactHolderCompareFallsBack: a driver releases, publishes and renews the leases it
// acquired with one exact compare of gen, and when the value changed under the same holder
// (another driver renewed the lease, writing a new expiry into gen) it sends the Txn again
// with holderIs's compares instead of refusing a current holder. The mutation exactOnly, which
// trusts the exact compare's refusal, must fail here; TestHolderComparePinsTheWholeOwner holds
// the fallback to refusing every other owner.
func TestExactHolderCompareFallsBack(t *testing.T) {
	t.Parallel()
	for _, mutant := range []bool{false, true} {
		const resource = "exact ресурс\x00"
		prefix := newPrefix()
		d := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix})
		t.Cleanup(func() { _ = d.Close() })
		other := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix})
		t.Cleanup(func() { _ = other.Close() })
		d.exactOnly = mutant
		prepare(t, d, resource)
		ctx := testCtx(t)
		g, err := d.Acquire(ctx, resource, "owner ö", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		l := driver.LeaseRef{Resource: resource, Owner: "owner ö", Epoch: g.Epoch, Generation: g.Generation}
		if _, ok := d.heldValueOf(l); !ok {
			t.Fatal("the acquisition recorded no gen value")
		}
		if _, ok, err := other.Renew(ctx, l, 2*time.Minute); !ok || err != nil {
			t.Fatalf("renew by another driver: %v, %v", ok, err)
		}
		ok, err := d.Publish(ctx, l, driver.Publication{Payload: []byte("p\x00"), OpID: "exact-" + prefix})
		if err != nil {
			t.Fatal(err)
		}
		ok2, err := d.Release(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		if caught := !ok || !ok2; caught != mutant {
			t.Errorf("exactOnly %v: publish %v, release %v after another driver's renewal", mutant, ok, ok2)
		}
	}
}
