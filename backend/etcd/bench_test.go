package etcd

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// BenchmarkProtocol compares fenced on etcd with the same transactions issued directly through
// clientv3, on the embedded three-member cluster (loopback, fsync on). Run with:
//
//	go test -run '^$' -bench Protocol -benchtime 1s -count 6 ./backend/etcd/
//
// and compare with benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	prefix := newPrefix()
	drivertest.Bench(b, drivertest.BenchTarget{
		Open: func(b *testing.B) driver.Driver { return openDriver(b, cluster.endpoints(), prefix) },
		Raw: func(b *testing.B) drivertest.Raw {
			return raw{cli: newClient(b, cluster.endpoints()), prefix: prefix}
		},
	})
}

// raw is the baseline: each operation's etcd requests written by hand, as application code
// would, with the same key layout and transactions as the driver, and without the retries,
// decoding checks and error wrapping.
type raw struct {
	cli    *clientv3.Client
	prefix string
}

func (r raw) keys(resource string) keys { return (&Driver{prefix: r.prefix}).keys(resource) }

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (int64, bool, error) {
	k := r.keys(resource)
	read, err := r.cli.Txn(ctx).Then(clientv3.OpGet(k.gen), clientv3.OpGet(k.owner)).Commit()
	if err != nil {
		return 0, false, err
	}
	gen, held := kv(read, 0), kv(read, 1) != nil
	if held {
		return 0, false, nil
	}
	g, err := decodeGen(gen.value)
	if err != nil {
		return 0, false, err
	}
	sent := time.Now()
	lease, err := r.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return 0, false, err
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k.gen), "=", gen.modRevision),
			clientv3.Compare(clientv3.CreateRevision(k.owner), "=", 0)).
		Then(clientv3.OpPut(k.gen, encodeGen(g+1)),
			clientv3.OpPut(k.owner, owner, clientv3.WithLease(lease.ID)),
			clientv3.OpPut(k.holder, owner),
			clientv3.OpPut(k.until, encodeTime(sent.Add(time.Duration(lease.TTL)*time.Second)))).
		Commit()
	if err != nil || !resp.Succeeded {
		_, _ = r.cli.Revoke(ctx, lease.ID)
		return 0, false, err
	}
	return g + 1, true, nil
}

func (r raw) publish(ctx context.Context, resource, owner string, gen int64, p []byte, release bool) (bool, error) {
	k := r.keys(resource)
	then := []clientv3.Op{clientv3.OpPut(k.pub, encodePub(gen, time.Now(), len(p))), clientv3.OpPut(k.payload, string(p))}
	if release {
		then = append(then, releaseOps(k)...)
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k.gen), "=", encodeGen(gen)),
			clientv3.Compare(clientv3.Value(k.owner), "=", owner),
			clientv3.Compare(clientv3.Value(k.pub), "<", encodeGen(gen))).
		Then(then...).
		Commit()
	if err != nil || !resp.Succeeded {
		return false, err
	}
	if release {
		r.revoke(ctx, resp, 2)
	}
	return true, nil
}

func (r raw) revoke(ctx context.Context, resp *clientv3.TxnResponse, i int) {
	if owner := kv(resp, i); owner != nil && owner.lease != 0 {
		_, _ = r.cli.Revoke(ctx, clientv3.LeaseID(owner.lease))
	}
}

func (r raw) Publish(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.publish(ctx, resource, owner, gen, p, false)
}

func (r raw) PublishAndRelease(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.publish(ctx, resource, owner, gen, p, true)
}

func (r raw) Release(ctx context.Context, resource, owner string, gen int64) (bool, error) {
	k := r.keys(resource)
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k.gen), "=", encodeGen(gen)),
			clientv3.Compare(clientv3.Value(k.holder), "=", owner)).
		Then(releaseOps(k)...).
		Commit()
	if err != nil || !resp.Succeeded {
		return false, err
	}
	r.revoke(ctx, resp, 0)
	return true, nil
}
