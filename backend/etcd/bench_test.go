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
// would, with the same key layout and transactions as the driver (epoch compares, the
// operation record), and without the retries, decoding checks, send tracking and error
// wrapping.
type raw struct {
	cli    *clientv3.Client
	prefix string
}

func (r raw) d() *Driver { return &Driver{prefix: r.prefix} }

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, bool, error) {
	d, k := r.d(), r.d().keys(resource)
	read, err := r.cli.Txn(ctx).Then(clientv3.OpGet(k.gen), clientv3.OpGet(k.owner), clientv3.OpGet(d.epochKey())).Commit()
	if err != nil {
		return driver.Grant{}, false, err
	}
	gen, owner0, ek := kv(read, 0), kv(read, 1), kv(read, 2)
	epoch, _ := decodeGen(ek.value)
	row, err := decodeHeld(gen.value)
	if err != nil {
		return driver.Grant{}, false, err
	}
	g := row.gen
	if owner0 != nil && row.epoch == epoch {
		return driver.Grant{}, false, nil
	}
	sent := time.Now()
	lease, err := r.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return driver.Grant{}, false, err
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k.gen), "=", gen.modRevision),
			clientv3.Compare(clientv3.Value(d.epochKey()), "=", encodeGen(epoch))).
		Then(clientv3.OpPut(k.gen, encodeHeld(epoch, g+1, owner, sent.Add(time.Duration(lease.TTL)*time.Second))),
			clientv3.OpPut(k.owner, owner, clientv3.WithLease(lease.ID))).
		Commit()
	if err != nil || !resp.Succeeded {
		_, _ = r.cli.Revoke(ctx, lease.ID)
		return driver.Grant{}, false, err
	}
	return driver.Grant{Epoch: epoch, Generation: g + 1}, true, nil
}

func (r raw) publish(ctx context.Context, l driver.LeaseRef, p driver.Publication, release bool) (bool, error) {
	d, k := r.d(), r.d().keys(l.Resource)
	now := time.Now()
	then := []clientv3.Op{clientv3.OpPut(k.pub, encodePub(l.Generation, l.Epoch, now, len(p.Payload))),
		clientv3.OpPut(k.payload, string(p.Payload)),
		clientv3.OpPut(d.opKey(p.OpID), encodeOp(driver.Operation{Outcome: driver.OutcomeAccepted,
			Resource: l.Resource, Epoch: l.Epoch, Generation: l.Generation, RecordedAt: now}))}
	if release {
		then = append(then, releaseOps(k, l)...)
	}
	resp, err := r.cli.Txn(ctx).
		If(append(holderIs(k, l), clientv3.Compare(clientv3.Value(d.epochKey()), "=", encodeGen(l.Epoch)),
			clientv3.Compare(clientv3.Value(k.owner), "=", l.Owner),
			clientv3.Compare(clientv3.Value(k.pub), "<", encodeGen(l.Generation)),
			clientv3.Compare(clientv3.CreateRevision(d.opKey(p.OpID)), "=", 0))...).
		Then(then...).
		Commit()
	if err != nil || !resp.Succeeded {
		return false, err
	}
	if release {
		r.revoke(ctx, resp, 3)
	}
	return true, nil
}

func (r raw) revoke(ctx context.Context, resp *clientv3.TxnResponse, i int) {
	if owner := deleted(resp, i); owner != nil && owner.lease != 0 {
		_, _ = r.cli.Revoke(ctx, clientv3.LeaseID(owner.lease))
	}
}

func (r raw) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.publish(ctx, l, p, false)
}

func (r raw) PublishAndRelease(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.publish(ctx, l, p, true)
}

func (r raw) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	d, k := r.d(), r.d().keys(l.Resource)
	resp, err := r.cli.Txn(ctx).
		If(append(holderIs(k, l), clientv3.Compare(clientv3.Value(d.epochKey()), "=", encodeGen(l.Epoch)))...).
		Then(releaseOps(k, l)...).
		Commit()
	if err != nil || !resp.Succeeded {
		return false, err
	}
	r.revoke(ctx, resp, 0)
	return true, nil
}
