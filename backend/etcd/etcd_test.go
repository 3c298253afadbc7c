package etcd

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// cluster is started once per test binary: three members on loopback.
var cluster *testCluster

func TestMain(m *testing.M) {
	c, err := startCluster(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start embedded etcd cluster:", err)
		os.Exit(1)
	}
	cluster = c
	code := m.Run()
	cluster.close()
	if code == 0 {
		// A grant or keepalive in the background of a driver that a test never closed ends
		// when its client closes, or at the latest after cleanupTimeout (a client left open
		// against a member that is gone retries until then); only what outlives that leaks.
		err := goleak.Find(leakOptions()...)
		for deadline := time.Now().Add(cleanupTimeout + time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(250 * time.Millisecond)
			err = goleak.Find(leakOptions()...)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions ignores the embedded server's peer (member-to-member) HTTP connections, one of
// which may still be winding down after Close; neither the driver nor clientv3 uses net/http,
// so every goroutine of the code under test is still checked.
func leakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
	}
}

// newPrefix is a key prefix no other test uses.
func newPrefix() string { return "/fenced-test/" + rand.Text() + "/" }

// newTarget gives each test its own key prefix on the shared cluster, and drivers with their
// own clients (Open owns the client, so closing the driver closes the connection).
func newTarget(t *testing.T) drivertest.Target {
	prefix := newPrefix()
	admin := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix})
	return drivertest.Target{
		Open: func(t *testing.T) driver.Driver { return openDriver(t, cluster.endpoints(), prefix) },
		Expire: func(ctx context.Context, resource string) error {
			return expire(ctx, admin, resource)
		},
		// A real connection to one member through a proxy that loses the reply of the next
		// conditional Txn after etcd committed it (txnProxy explains why not drivertest.Proxy).
		LostReply: func(t *testing.T) (driver.Driver, func()) {
			p := startTxnProxy(t, cluster.endpoints()[0])
			return New(newClientWith(t, []string{p.addr()}), &Options{Prefix: prefix}), p.arm
		},
		// clientv3 makes every call wait for a connection until its context ends
		// (WaitForReady), and the suite's contexts last a minute; this client's calls fail as
		// soon as the dial fails instead, as Open's do (failFast). (Not a shorter per-call
		// deadline: clientv3's retry interceptor resends a call whose own context ended while
		// the caller's is alive.)
		Unreachable: func(t *testing.T) driver.Driver {
			return New(newClientWith(t, []string{drivertest.ClosedAddr(t)}, grpc.WithChainUnaryInterceptor(failFast)), &Options{Prefix: prefix})
		},
		// The store is every key under its prefix; TestNewClusterNeverReissues loses a whole
		// cluster instead.
		LoseEverything: func(ctx context.Context) error {
			_, err := admin.cli.Delete(ctx, prefix, clientv3.WithPrefix())
			return err
		},
		SetEpoch: func(ctx context.Context, epoch int64) error {
			_, err := admin.cli.Put(ctx, admin.epochKey(), encodeGen(epoch))
			return err
		},
		NoRowLock: "etcd has no locks: a Txn is applied in log order and judges expiry by the owner key's " +
			"existence at that point, which the leader's lease expiry revokes in the same log",
	}
}

func openDriver(t testing.TB, endpoints []string, prefix string) *Driver {
	t.Helper()
	d, err := Open(etcdURL(endpoints, prefix))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// expire does what etcd does when an etcd lease's TTL runs out: the owner key disappears
// (here in one Txn that reads and deletes it, so that a renewal moving the key onto a new etcd
// lease at the same moment cannot slip past), then the etcd lease it was on is revoked.
// TestPausedClientOutlivesItsLease waits for the real thing instead.
func expire(ctx context.Context, d *Driver, resource string) error {
	owner := d.keys(resource).owner
	resp, err := d.cli.Txn(ctx).Then(clientv3.OpGet(owner), clientv3.OpDelete(owner)).Commit()
	if err != nil {
		return err
	}
	if kv := kv(resp, 0); kv != nil && kv.lease != 0 {
		if _, err := d.cli.Revoke(ctx, clientv3.LeaseID(kv.lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return err
		}
	}
	return nil
}

func TestConformance(t *testing.T) { drivertest.Run(t, newTarget) }
