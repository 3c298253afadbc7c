package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced/driver"
)

// TestRenewDoesNotWaitForRevocation: every revocation is held at the client until the test
// lets it go; a renewal must still answer (it moved the owner key to a new etcd lease, and the
// previous lease is cleanup), and the previous lease's revocation must still be sent, in the
// background. Run's renewals follow one another, so a renewal that waited on a third Raft
// proposal extended the trust window later on a slow member.
func TestRenewDoesNotWaitForRevocation(t *testing.T) {
	t.Parallel()
	revoking := make(chan struct{}, 16)
	release := make(chan struct{})
	hold := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.Lease/LeaseRevoke" {
			revoking <- struct{}{}
			<-release
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	d := New(newClientWith(t, cluster.endpoints(), hold), &Options{Prefix: newPrefix()})
	t.Cleanup(func() { _ = d.Close() })
	t.Cleanup(func() { close(release) }) // first: Close waits for the background revocations
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "owner-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l := driver.LeaseRef{Resource: "r", Owner: "owner-1", Epoch: g.Epoch, Generation: g.Generation}
	renewed := make(chan error, 1)
	go func() {
		_, ok, err := d.Renew(ctx, l, 5*time.Second)
		if err == nil && !ok {
			err = errors.New("refused")
		}
		renewed <- err
	}()
	// Both orders are possible: the revocation may be sent before the renewal's answer is
	// read here. What must hold is that the renewal answers while the revocation is held.
	select {
	case err := <-renewed:
		if err != nil {
			t.Fatalf("renew: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the renewal waited for the previous etcd lease's revocation")
	}
	select {
	case <-revoking:
	case <-ctx.Done():
		t.Fatal("the previous etcd lease was never revoked")
	}
}
