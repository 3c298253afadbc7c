package etcd

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/fenced-dev/fenced/driver"
)

// TestReplacedKVIsUsed: a client whose KV the caller replaced (here by a namespace, which
// prefixes every key) gets every Txn through that KV, not straight to the connection (ownKV),
// so the driver's keys stay inside the namespace. Mutant caught: ownKV always true puts the
// keys at the top of the keyspace, where this test finds them.
func TestReplacedKVIsUsed(t *testing.T) {
	t.Parallel()
	const resource = "namespaced ресурс\x00"
	ns, prefix := newPrefix(), newPrefix()
	cli := newClient(t, cluster.endpoints())
	cli.KV = namespace.NewKV(cli.KV, ns)
	d := New(cli, &Options{Prefix: prefix})
	t.Cleanup(func() { _ = d.Close() })
	prepare(t, d, resource)
	ctx := testCtx(t)
	l := acquired(ctx, t, d, resource, "owner ä")
	if ok, err := d.PublishAndRelease(ctx, l, driver.Publication{Payload: []byte("a\x00b"), OpID: "op " + newPrefix()}); !ok || err != nil {
		t.Fatalf("publish and release: %v, %v", ok, err)
	}
	plain := newClient(t, cluster.endpoints())
	for key, want := range map[string]bool{ns + prefix + resource + "/gen": true, prefix + resource + "/gen": false,
		ns + prefix + resource + "/payload": true, prefix + "epoch": false} {
		resp, err := plain.Get(ctx, key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Count == 1; got != want {
			t.Errorf("key %q exists: %v, want %v", key, got, want)
		}
	}
	if !ownKV(plain) {
		t.Error("a client as clientv3.New made it is taken for one with a replaced KV")
	}
}

// acquired acquires the resource for owner with a TTL of a minute and returns the lease.
func acquired(ctx context.Context, t *testing.T, d *Driver, resource, owner string) driver.LeaseRef {
	t.Helper()
	g, err := d.Acquire(ctx, resource, owner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return driver.LeaseRef{Resource: resource, Owner: owner, Epoch: g.Epoch, Generation: g.Generation}
}
