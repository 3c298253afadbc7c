package etcd

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced/driver"
)

// TestPairReadsNothingThroughRaft: the conditional Txns of an acquisition and a release carry
// no Get, in either branch, and write 3 keys and delete 1 between them (gen and owner; owner
// deleted, gen back to the bare token). A Txn that writes goes through Raft and the WAL whole, reads
// included, also the reads of a branch etcd does not take; the only read a pair needs, the
// released owner key's etcd lease, comes from its delete (WithPrevKV).
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
	}
}
