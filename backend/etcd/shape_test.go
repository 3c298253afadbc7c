package etcd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced/driver"
)

// TestPairReadsNothingThroughRaft: the conditional Txns of an acquisition and a release carry
// no Get, in either branch, write 3 keys and delete 1 between them (gen and owner; owner
// deleted, gen back to the bare token), and compare 4 (etcd reads each compared key). A Txn that writes goes through Raft and the WAL whole, reads
// included, also the reads of a branch etcd does not take; the released owner key's etcd lease
// is the one the acquisition put it on, recorded with the gen value it wrote, so the release's
// delete reads nothing back either (releaseOpsKnown).
func TestPairReadsNothingThroughRaft(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		txns []*pb.TxnRequest
	)
	record := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*pb.TxnRequest); ok && len(r.Compare) > 0 {
			mu.Lock()
			txns = append(txns, r)
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	const resource = "shape ресурс\x00"
	d := New(newClientWith(t, cluster.endpoints(), record), &Options{Prefix: newPrefix()})
	t.Cleanup(func() { _ = d.Close() })
	prepare(t, d, resource)
	ctx := testCtx(t)
	mu.Lock()
	txns = nil
	mu.Unlock()
	for i := range 2 { // read first, then from the cached snapshot
		g, err := d.Acquire(ctx, resource, "owner "+string(rune('a'+i)), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		l := driver.LeaseRef{Resource: resource, Owner: "owner " + string(rune('a'+i)), Epoch: g.Epoch, Generation: g.Generation}
		if ok, err := d.Release(ctx, l); !ok || err != nil {
			t.Fatalf("release: %v, %v", ok, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(txns) != 4 {
		t.Fatalf("%d conditional Txns for two acquire+release pairs, want 4", len(txns))
	}
	for i, r := range txns {
		for _, op := range append(append([]*pb.RequestOp{}, r.Success...), r.Failure...) {
			if op.GetRequestRange() != nil {
				t.Errorf("Txn %d (%d compares) reads %q", i, len(r.Compare), op.GetRequestRange().Key)
			}
			if del := op.GetRequestDeleteRange(); del != nil && del.PrevKv {
				t.Errorf("Txn %d (%d compares) reads back the key it deletes, %q", i, len(r.Compare), del.Key)
			}
		}
	}
	for pair := range 2 {
		var puts, deletes int
		for _, r := range txns[2*pair : 2*pair+2] {
			for _, op := range r.Success {
				switch {
				case op.GetRequestPut() != nil:
					puts++
				case op.GetRequestDeleteRange() != nil:
					deletes++
				}
			}
		}
		if puts != 3 || deletes != 1 {
			t.Errorf("pair %d writes %d keys and deletes %d, want 3 and 1", pair, puts, deletes)
		}
		// The acquisition pins gen's revision and the epoch (which pins the owner key's
		// absence: acquireCompares); the release compares gen with the value the acquisition
		// wrote, and the epoch.
		if acq, rel := len(txns[2*pair].Compare), len(txns[2*pair+1].Compare); acq != 2 || rel != 2 {
			t.Errorf("pair %d compares %d and %d keys, want 2 and 2", pair, acq, rel)
		}
	}
}

// TestRetryReadsInItsElse forces an acquisition to lose two races in a row (another driver
// acquires and releases the resource just before each of its Txns): after the first loss it
// reads the resource in a Txn of its own, and its retries carry that read in their Else, so
// that a loser under contention takes one round trip per attempt, as the winner does.
func TestRetryReadsInItsElse(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		txns  []*pb.TxnRequest
		reads int
	)
	record := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*pb.TxnRequest); ok {
			mu.Lock()
			if len(r.Compare) > 0 {
				txns = append(txns, r)
			} else {
				reads++
			}
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	const resource = "retry ресурс\x00"
	prefix := newPrefix()
	loser := New(newClientWith(t, cluster.endpoints(), record), &Options{Prefix: prefix})
	t.Cleanup(func() { _ = loser.Close() })
	winner := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix})
	t.Cleanup(func() { _ = winner.Close() })
	prepare(t, winner, resource)
	ctx := testCtx(t)
	if _, err := loser.Read(ctx, resource); err != nil { // connected before the count starts
		t.Fatal(err)
	}
	races := 0
	loser.ahead.reuse.beforeTxn = func(clientv3.LeaseID) {
		if races++; races > 2 {
			return
		}
		g, err := winner.Acquire(ctx, resource, "winner", time.Minute)
		if err != nil {
			t.Error(err)
			return
		}
		if ok, err := winner.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "winner", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
			t.Errorf("release: %v, %v", ok, err)
		}
	}
	mu.Lock()
	txns, reads = nil, 0
	mu.Unlock()
	g, err := loser.Acquire(ctx, resource, "loser", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(txns) != 3 || g.Generation != 3 {
		t.Fatalf("%d acquire Txns, generation %d: want 3 and 3 (two races lost)", len(txns), g.Generation)
	}
	// One read before the first attempt (nothing cached), one after the first loss.
	if reads != 2 {
		t.Errorf("%d reads in Txns of their own, want 2", reads)
	}
	for i, r := range txns {
		if carries := len(r.Failure) > 0; carries != (i > 0) {
			t.Errorf("attempt %d carries %d reads in its Else", i+1, len(r.Failure))
		}
	}
}

// TestAcquireTwiceFromOneDriver: the acquisition's Txn compares only gen's mod revision and the
// epoch, which pin the owner key's absence only because no snapshot of a held resource is ever
// cached (acquireCompares). A driver that acquires, then acquires again while it holds the
// lease, is answered busy; once etcd has expired the lease (the owner key deleted, gen
// untouched), the same driver acquires the next generation. Caching the snapshot after an
// acquisition, as the driver did when a third compare checked the owner key, grants the
// second acquisition here.
func TestAcquireTwiceFromOneDriver(t *testing.T) {
	t.Parallel()
	const resource = "twice ресурс\x00"
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: newPrefix()})
	t.Cleanup(func() { _ = d.Close() })
	prepare(t, d, resource)
	ctx := testCtx(t)
	for i := range 2 { // the first pair from a read, the second from the released snapshot
		g, err := d.Acquire(ctx, resource, "first", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var busy *driver.BusyError
		if _, err := d.Acquire(ctx, resource, "second", time.Minute); !errors.As(err, &busy) || busy.Generation != g.Generation {
			t.Fatalf("round %d: a second acquisition of a held lease: %v, want busy at generation %d", i, err, g.Generation)
		}
		if err := expire(ctx, d, resource); err != nil {
			t.Fatal(err)
		}
		g2, err := d.Acquire(ctx, resource, "third", time.Minute)
		if err != nil || g2.Generation != g.Generation+1 {
			t.Fatalf("round %d: acquisition after expiry: %+v, %v, want generation %d", i, g2, err, g.Generation+1)
		}
		l := driver.LeaseRef{Resource: resource, Owner: "third", Epoch: g2.Epoch, Generation: g2.Generation}
		if ok, err := d.Release(ctx, l); !ok || err != nil {
			t.Fatalf("round %d: release: %v, %v", i, ok, err)
		}
	}
}
