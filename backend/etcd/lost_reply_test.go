package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fenced-dev/fenced"
)

// replyDropper loses the reply of the next conditional Txn once armed: etcd has committed it,
// and the caller sees Unavailable, as when a connection breaks after the request was sent.
type replyDropper struct{ armed atomic.Bool }

func (r *replyDropper) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if txn, ok := req.(*pb.TxnRequest); ok && err == nil && len(txn.Compare) > 0 && r.armed.CompareAndSwap(true, false) {
		return status.Error(codes.Unavailable, "test: the reply was lost")
	}
	return err
}

func lossyStore(t *testing.T, prefix string) (*fenced.Store, *replyDropper) {
	t.Helper()
	cli, r := lossyClient(t)
	return newStore(t, New(cli, &Options{Prefix: prefix})), r
}

// lossyClient is a client whose replyDropper loses the reply of the next conditional Txn once
// armed.
func lossyClient(t *testing.T) (*clientv3.Client, *replyDropper) {
	t.Helper()
	r := &replyDropper{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cluster.endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: append(DialOptions(), grpc.WithChainUnaryInterceptor(r.intercept)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, r
}

// wantOperational checks that err is neither busy nor a refusal: the outcome is unknown.
func wantOperational(t *testing.T, err error) {
	t.Helper()
	if err == nil || errors.Is(err, fenced.ErrBusy) || errors.Is(err, fenced.ErrRefused) || errors.Is(err, fenced.ErrNotProvisioned) {
		t.Fatalf("got %v, want an operational error", err)
	}
}

// TestLostReplies: for each operation, etcd commits the Txn and the reply is lost (here the
// interceptor turns a received reply into an error; the suite's LostReply loses it on the
// wire, through txnProxy). The caller
// gets an operational error (never busy or refused); what etcd did stays consistent, and a
// retry is answered from etcd's state, never applied twice.
func TestLostReplies(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	s, lose := lossyStore(t, prefix)
	observer := newStore(t, openDriver(t, cluster.endpoints(), prefix))
	if err := s.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	show := func() fenced.State {
		t.Helper()
		st, err := observer.Show(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	// Acquire: generation 1 was issued and stays held by its (unknown) owner until its etcd
	// lease runs out, as a crashed holder's would; generation 1 is never issued again.
	lose.armed.Store(true)
	_, err := s.Acquire(ctx, "r", time.Minute)
	wantOperational(t, err)
	if st := show(); st.Generation != 1 || !st.Held() {
		t.Fatalf("after a lost acquisition reply: %+v", st)
	}
	if _, err := s.Acquire(ctx, "r", time.Minute); !errors.Is(err, fenced.ErrBusy) {
		t.Fatalf("acquire while the unknown acquisition holds: %v", err)
	}
	if err := expire(ctx, New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix}), "r"); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "r", time.Minute)
	if err != nil || l.Generation() != 2 {
		t.Fatalf("acquire after a lost reply: %v, generation %d", err, l.Generation())
	}

	// Renew: the owner key moved to the new etcd lease, which stays: the lease is still held.
	lose.armed.Store(true)
	wantOperational(t, l.Renew(ctx, 2*time.Minute))
	if st := show(); !st.Held() || st.Owner != l.Owner() {
		t.Fatalf("after a lost renewal reply: %+v", st)
	}

	// Publish: it happened; the retry is refused as already published.
	lose.armed.Store(true)
	wantOperational(t, l.Publish(ctx, []byte("once")))
	if st := show(); st.PublishedGeneration != 2 {
		t.Fatalf("after a lost publication reply: %+v", st)
	}
	wantCause(t, l.Publish(ctx, []byte("twice")), fenced.CauseAlreadyPublished)
	wantPublished(t, observer, "r", []byte("once"), 2)

	// Release: it happened; the retry is refused as released.
	lose.armed.Store(true)
	wantOperational(t, l.Release(ctx))
	if st := show(); st.Held() || st.Owner != "" {
		t.Fatalf("after a lost release reply: %+v", st)
	}
	wantCause(t, l.Release(ctx), fenced.CauseReleased)

	// PublishAndRelease: both happened.
	l3, err := s.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lose.armed.Store(true)
	wantOperational(t, l3.PublishAndRelease(ctx, []byte("three")))
	if st := show(); st.Held() || st.PublishedGeneration != 3 {
		t.Fatalf("after a lost publish-and-release reply: %+v", st)
	}
	wantCause(t, l3.PublishAndRelease(ctx, []byte("again")), fenced.CauseAlreadyPublished)
}
