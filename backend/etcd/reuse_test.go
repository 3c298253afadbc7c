package etcd

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced/driver"
)

// reuseTTL is above etcd's minimum TTL (2 s with the test cluster's election timeout), so that
// the lease's remaining life tells a keepalive from none.
const reuseTTL = 3 * time.Second

// reuseDriver opens a driver that grants nothing ahead (every lease comes from the reuse pool
// or a grant during the acquisition), migrated, its epoch bumped and the resources
// provisioned. mutate runs before anything else.
func reuseDriver(t *testing.T, cli *clientv3.Client, mutate func(*reusePool), resources ...string) *Driver {
	t.Helper()
	d := New(cli, &Options{Prefix: newPrefix(), AheadBound: -1})
	t.Cleanup(func() { _ = d.Close() })
	if mutate != nil {
		mutate(&d.ahead.reuse)
	}
	prepare(t, d, resources...)
	return d
}

// acquireReleased acquires the resource and releases it, confirmed, returning the etcd lease
// its owner key was on.
func acquireReleased(t *testing.T, d *Driver, resource string) clientv3.LeaseID {
	t.Helper()
	ctx := testCtx(t)
	g, err := d.Acquire(ctx, resource, "first holder", reuseTTL)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ownerLease(t, d, resource)
	if ok, err := d.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "first holder", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	return id
}

// idle reports whether the lease is in the reuse pool.
func (d *Driver) idle(id clientv3.LeaseID) bool {
	d.ahead.mu.Lock()
	defer d.ahead.mu.Unlock()
	for _, list := range d.ahead.reuse.idle {
		for _, l := range list {
			if l.id == id {
				return true
			}
		}
	}
	return false
}

// TestReleasedLeaseIsReusedKeptAlive: the etcd lease of a confirmed release serves the next
// acquisition, after one keepalive that gives it its whole TTL again from the acquisition's
// start; while it carries that owner key, no other acquisition gets it. Mutations: no reuse
// (DisableLeaseReuse) and no keepalive (noRefresh), each caught.
func TestReleasedLeaseIsReusedKeptAlive(t *testing.T) {
	const r1, r2, r3 = "reuse ресурс one", "reuse two\x00 résource", "reuse three"
	for _, mutant := range []string{"", "no reuse", "no keepalive"} {
		t.Run("mutant="+mutant, func(t *testing.T) {
			ctx := testCtx(t)
			d := reuseDriver(t, newClient(t, cluster.endpoints()), func(p *reusePool) { p.noRefresh = mutant == "no keepalive" }, r1, r2, r3)
			d.noReuse = mutant == "no reuse"
			released := acquireReleased(t, d, r1)
			// Wait, on the clock, until etcd has at most 1 s of the lease's life left: only a
			// keepalive can give the next acquisition its TTL.
			for {
				ttl, err := d.cli.TimeToLive(ctx, released)
				if err != nil {
					t.Fatal(err)
				}
				if ttl.TTL <= 1 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			start := time.Now()
			g, err := d.Acquire(ctx, r2, "second holder", reuseTTL)
			if err != nil {
				t.Fatal(err)
			}
			id, remaining := ownerLease(t, d, r2)
			caught := false
			if id != released {
				caught = true
				if mutant == "" {
					t.Fatalf("the acquisition got etcd lease %x, not the released %x", id, released)
				}
			}
			// TimeToLive truncates to whole seconds.
			if want := int64((reuseTTL - time.Since(start)) / time.Second); remaining < want || g.LeaseUntil.Before(start.Add(reuseTTL)) {
				caught = true
				if mutant == "" {
					t.Fatalf("the reused lease has %d s left (want %d), reported until %v, %v after the start",
						remaining, want, g.LeaseUntil, g.LeaseUntil.Sub(start))
				}
			}
			if _, err := d.Acquire(ctx, r3, "third holder", reuseTTL); err != nil {
				t.Fatal(err)
			}
			if id3, _ := ownerLease(t, d, r3); id3 == id {
				t.Fatalf("etcd lease %x carries the owner keys of two acquisitions at once", id)
			}
			if mutant != "" && !caught {
				t.Fatalf("mutant %q not caught", mutant)
			}
		})
	}
}

// TestExpiredPooledLeaseIsDropped: a lease of the pool that etcd expired (here revoked, which
// is what etcd's lessor does at expiry) answers the keepalive "not found"; one whose
// keepalive was answered and that expires before the acquisition's Txn arrives makes etcd
// refuse the whole Txn. Either way the acquisition goes on with a lease granted then, exactly
// once (one generation more), and the gone lease leaves the pool. Mutation: a lease gone is
// an error (goneIsError), caught in both schedules.
func TestExpiredPooledLeaseIsDropped(t *testing.T) {
	const r1, r2 = "expired pool résource", "expired pool ресурс\x00 two"
	for _, when := range []string{"in the pool", "before the Txn"} {
		for _, mutant := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/goneIsError=%v", when, mutant), func(t *testing.T) {
				ctx := testCtx(t)
				d := reuseDriver(t, newClient(t, cluster.endpoints()), func(p *reusePool) { p.goneIsError = mutant }, r1, r2)
				released := acquireReleased(t, d, r1)
				expire := func() {
					if _, err := d.cli.Revoke(ctx, released); err != nil {
						t.Error(err)
					}
				}
				if when == "in the pool" {
					expire()
				} else {
					var once bool
					d.ahead.reuse.beforeTxn = func(id clientv3.LeaseID) {
						if id == released && !once {
							once = true
							expire()
						}
					}
				}
				before, err := d.Read(ctx, r2)
				if err != nil {
					t.Fatal(err)
				}
				g, err := d.Acquire(ctx, r2, "after expiry", reuseTTL)
				if mutant {
					if err == nil {
						t.Fatal("mutant goneIsError not caught")
					}
					return
				}
				if err != nil {
					t.Fatalf("acquire after the pooled lease expired %s: %v", when, err)
				}
				if g.Generation != before.Generation+1 {
					t.Fatalf("generation %d after %d", g.Generation, before.Generation)
				}
				id, remaining := ownerLease(t, d, r2)
				if id == released || remaining < 1 {
					t.Fatalf("owner key on etcd lease %x with %d s left (the expired one was %x)", id, remaining, released)
				}
				if d.idle(released) {
					t.Fatal("the expired lease is still in the pool")
				}
			})
		}
	}
}

// TestUnconfirmedReleaseIsNotReused: a release whose reply was lost (etcd committed it or not:
// the driver cannot tell) and a refused release never put the lease back in the pool, since
// the owner key may still be on it and a keepalive would lengthen someone's lease. Mutation:
// pooling it anyway (keepUnconfirmed), caught.
func TestUnconfirmedReleaseIsNotReused(t *testing.T) {
	const r1, r2 = "lost release résource", "lost release ресурс\x00 two"
	for _, how := range []string{"reply lost", "refused"} {
		for _, mutant := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/keepUnconfirmed=%v", how, mutant), func(t *testing.T) {
				ctx := testCtx(t)
				cli, lose := lossyClient(t)
				d := reuseDriver(t, cli, func(p *reusePool) { p.keepUnconfirmed = mutant }, r1, r2)
				g, err := d.Acquire(ctx, r1, "holder", reuseTTL)
				if err != nil {
					t.Fatal(err)
				}
				id, _ := ownerLease(t, d, r1)
				ref := driver.LeaseRef{Resource: r1, Owner: "holder", Epoch: g.Epoch, Generation: g.Generation}
				if how == "reply lost" {
					lose.armed.Store(true)
					if ok, err := d.Release(ctx, ref); ok || err == nil {
						t.Fatalf("release with its reply lost: %v %v", ok, err)
					}
				} else {
					ref.Generation++ // a token that does not hold
					if ok, err := d.Release(ctx, ref); ok || err != nil {
						t.Fatalf("stale release: %v %v", ok, err)
					}
				}
				if _, err := d.Acquire(ctx, r2, "next", reuseTTL); err != nil {
					t.Fatal(err)
				}
				next, _ := ownerLease(t, d, r2)
				if (next == id || d.idle(id)) != mutant {
					t.Fatalf("keepUnconfirmed=%v: the lease of the unconfirmed release was reused: %v, pooled: %v", mutant, next == id, d.idle(id))
				}
			})
		}
	}
}

// rpcCounter counts the calls of each gRPC method a client makes, streams included.
type rpcCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *rpcCounter) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[method[strings.LastIndex(method, "/")+1:]]++
}

func (c *rpcCounter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.add(method)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *rpcCounter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c.add(method)
	return streamer(ctx, desc, cc, method, opts...)
}

func (c *rpcCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// TestReuseBoundsGrants: 16 goroutines, each acquiring and releasing its own resource 40 times
// with nothing granted ahead, grant at most one etcd lease each (then reuse it after a
// keepalive) and revoke none; without reuse (the mutation), every acquisition grants and every
// release revokes. The counts of the default driver (leases granted ahead as well) are logged.
func TestReuseBoundsGrants(t *testing.T) {
	const workers, cycles = 16, 40
	for _, variant := range []string{"reuse", "no reuse (mutant)", "default"} {
		t.Run(variant, func(t *testing.T) {
			ctx := testCtx(t)
			c := &rpcCounter{n: map[string]int{}}
			cli := newClientWith(t, cluster.endpoints(), grpc.WithChainUnaryInterceptor(c.unary), grpc.WithChainStreamInterceptor(c.stream))
			opts := &Options{Prefix: newPrefix(), AheadBound: -1, DisableLeaseReuse: variant == "no reuse (mutant)"}
			if variant == "default" {
				opts.AheadBound = 0
			}
			d := New(cli, opts)
			resources := make([]string, workers)
			for w := range resources {
				resources[w] = fmt.Sprintf("counted résource\x00 %d", w)
			}
			prepare(t, d, resources...)
			c.take()
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for range cycles {
						g, err := d.Acquire(ctx, resources[w], "counted", time.Minute)
						if err != nil {
							t.Error(err)
							return
						}
						if ok, err := d.Release(ctx, driver.LeaseRef{Resource: resources[w], Owner: "counted", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
							t.Errorf("release: %v %v", ok, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := d.Close(); err != nil { // waits for the background grants and revocations
				t.Fatal(err)
			}
			n := c.take()
			t.Logf("%s: %d cycles: %v (Close's revocations of the pools included)", variant, workers*cycles, n)
			grants, revokes := n["LeaseGrant"], n["LeaseRevoke"]
			switch caught := grants > workers; variant {
			case "reuse":
				if caught || revokes > workers {
					t.Fatalf("%d grants and %d revocations for %d acquisitions by %d goroutines", grants, revokes, workers*cycles, workers)
				}
			case "no reuse (mutant)":
				if !caught {
					t.Fatalf("mutant not caught: %d grants", grants)
				}
			}
		})
	}
}

// TestReleaseAfterExpiryHandsBackNothing: a release deletes the owner key without reading it
// back when this driver wrote the gen value (releaseOpsKnown), and hands back the etcd lease
// recorded with that value only when the delete removed a key. Once etcd has expired the
// lease (the owner key deleted and the etcd lease revoked, as etcd's lessor does), the release
// still succeeds, the lease being unsuperseded, and the gone etcd lease goes to no pool; a
// release of a live lease hands its etcd lease back. (A publish-and-release needs the owner
// key, so it never deletes a missing one.) Mutation: the lease handed back whatever the
// delete found, caught (the gone lease sits in the reuse pool).
func TestReleaseAfterExpiryHandsBackNothing(t *testing.T) {
	t.Parallel()
	const resource = "expired release ресурс\x00"
	ctx := testCtx(t)
	d := reuseDriver(t, newClient(t, cluster.endpoints()), nil, resource)
	for _, expired := range []bool{true, false} {
		g, err := d.Acquire(ctx, resource, "holder", reuseTTL)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := ownerLease(t, d, resource)
		if expired {
			if err := expire(ctx, d, resource); err != nil {
				t.Fatal(err)
			}
		}
		l := driver.LeaseRef{Resource: resource, Owner: "holder", Epoch: g.Epoch, Generation: g.Generation}
		if ok, err := d.Release(ctx, l); !ok || err != nil {
			t.Fatalf("expired %v: release: %v, %v", expired, ok, err)
		}
		if pooled := d.idle(id); pooled == expired {
			t.Fatalf("expired %v: etcd lease %x in the reuse pool: %v", expired, id, pooled)
		}
	}
}
