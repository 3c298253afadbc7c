package etcd

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fenced-dev/fenced/driver"
)

// migrated returns a driver on its own prefix, migrated.
func migrated(t *testing.T) *Driver {
	t.Helper()
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: newPrefix()})
	if err := d.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestClassify: only a Txn that never left the client, or that etcd rejected as a whole, is
// not applied.
func TestClassify(t *testing.T) {
	began := &sent{}
	began.begun.Store(true)
	queued := &sent{}
	queued.begun.Store(true)
	queued.queued.Store(true)
	unavailable := status.Error(codes.Unavailable, "error reading from server: EOF")
	for _, c := range []struct {
		err        error
		w          *sent
		notApplied bool
	}{
		{unavailable, began, true},
		{context.DeadlineExceeded, began, true},
		{unavailable, queued, false},
		{unavailable, nil, false},
		{unavailable, &sent{}, false}, // no stats handler: nothing is known
		{context.DeadlineExceeded, queued, false},
		{context.Canceled, queued, false},
		{rpctypes.ErrTimeout, queued, false},
		{rpctypes.ErrLeaderChanged, queued, false},
		{rpctypes.ErrRequestTooLarge, queued, true},
		{rpctypes.ErrTooManyOps, queued, true},
		{rpctypes.ErrLeaseNotFound, queued, true},
		{rpctypes.ErrNoSpace, queued, true},
		{rpctypes.ErrTooManyRequests, queued, true},
		{rpctypes.ErrPermissionDenied, queued, true},
		{rpctypes.Error(rpctypes.ErrGRPCRequestTooLarge), queued, true},
		{fmt.Errorf("wrapped: %w", rpctypes.ErrGRPCCompacted), queued, true},
		{status.Error(codes.ResourceExhausted, "trying to send message larger than max (9 vs. 2)"), queued, true},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9 vs. 2)"), queued, false},
		{status.Error(codes.Internal, "x"), queued, false},
	} {
		if got := errors.Is(classify(c.err, c.w), driver.ErrNotApplied); got != c.notApplied {
			t.Errorf("classify(%v, begun=%v queued=%v) not applied = %v, want %v", c.err,
				c.w != nil && c.w.begun.Load(), c.w != nil && c.w.queued.Load(), got, c.notApplied)
		}
	}
}

// TestEpochBumpLeavesKeys: a bump changes only the epoch key; the old owner key stays until
// its etcd lease ends, yet the lease is free, reported free, and fenced.
func TestEpochBumpLeavesKeys(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := migrated(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "a", time.Hour)
	if err != nil || g.Epoch < 1<<40 || g.Generation != 1 {
		t.Fatalf("acquire: %+v, %v; want an epoch from the clock", g, err)
	}
	e, err := d.BumpEpoch(ctx)
	if err != nil || e <= g.Epoch {
		t.Fatalf("bump: %d after %d, %v", e, g.Epoch, err)
	}
	if resp, err := d.cli.Get(ctx, d.keys("r").owner); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the owner key after the bump: %v, %v", resp, err)
	}
	st, err := d.Read(ctx, "r")
	if err != nil || st.Held() || st.Owner != "" || st.Epoch != g.Epoch || st.CurrentEpoch != e {
		t.Fatalf("read after the bump: %+v, %v", st, err)
	}
	old := driver.LeaseRef{Resource: "r", Owner: "a", Epoch: g.Epoch, Generation: 1}
	if _, ok, err := d.Renew(ctx, old, time.Hour); ok || err != nil {
		t.Fatalf("renew from the old epoch: %v, %v", ok, err)
	}
	// The owner key of the old epoch is still there: Acquire takes the "earlier epoch" path.
	g2, err := d.Acquire(ctx, "r", "b", time.Hour)
	if err != nil || g2.Epoch != e || g2.Generation != 2 {
		t.Fatalf("acquire after the bump: %+v, %v", g2, err)
	}
	var busy *driver.BusyError
	if _, err := d.Acquire(ctx, "r", "c", time.Hour); !errors.As(err, &busy) || busy.Epoch != e || busy.Generation != 2 {
		t.Fatalf("acquire while b holds: %v", err)
	}
}

// TestMissingEpochKeyIsNotApplied: no Txn guesses an epoch, and a bump does not recreate it.
func TestMissingEpochKeyIsNotApplied(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := migrated(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.cli.Delete(ctx, d.epochKey()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, "r", "o", time.Minute); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("acquire without an epoch: %v", err)
	}
	if _, err := d.BumpEpoch(ctx); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("bump without an epoch: %v", err)
	}
	if resp, err := d.cli.Get(ctx, d.epochKey()); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the epoch key was recreated: %v, %v", resp, err)
	}
}

// TestConcurrentBumpsEachCount: bumps racing on the epoch key's compare-and-swap all land,
// each on an epoch of its own.
func TestConcurrentBumpsEachCount(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := migrated(t)
	const n = 4
	type result struct {
		epoch int64
		err   error
	}
	start, results := make(chan struct{}), make(chan result, n)
	for range n {
		go func() {
			<-start
			e, err := d.BumpEpoch(ctx)
			results <- result{e, err}
		}()
	}
	close(start)
	seen := map[int64]bool{}
	var highest int64
	for range n {
		r := <-results
		if r.err != nil || seen[r.epoch] {
			t.Fatalf("bump: %d, %v (epochs so far %v)", r.epoch, r.err, seen)
		}
		seen[r.epoch], highest = true, max(highest, r.epoch)
	}
	if e, err := d.BumpEpoch(ctx); err != nil || e <= highest {
		t.Fatalf("epoch after %d bumps (highest %d) and one more: %d, %v", n, highest, e, err)
	}
}

// TestPruneSkipsResourceKeys: a resource whose name starts with "ops/" lives among the
// operation keys; pruning leaves it alone.
func TestPruneSkipsResourceKeys(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := migrated(t)
	if err := d.Provision(ctx, "ops/x"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"gen", "a", "b"} {
		if _, err := d.ResolveOperation(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// Records written before now - age: move the recorded time back, as a slow clock would.
	old := encodeOp(driver.Operation{Outcome: driver.OutcomeAborted, RecordedAt: time.Now().Add(-time.Hour)})
	for _, id := range []string{"gen", "a"} {
		if _, err := d.cli.Put(ctx, d.opKey(id), old); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := d.PruneOperations(ctx, time.Minute); err != nil || n != 2 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	if op, err := d.ReadOperation(ctx, "b"); err != nil || op.Outcome != driver.OutcomeAborted {
		t.Fatalf("a recent record: %+v, %v", op, err)
	}
	if st, err := d.Read(ctx, "ops/x"); err != nil || st.Generation != 0 {
		t.Fatalf("the resource ops/x after pruning: %+v, %v", st, err)
	}
}

// TestMigrateRefusesNewerSchema: a store written by a newer layout is refused; Migrate never
// resets the epoch.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := migrated(t)
	e, err := d.BumpEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := d.cli.Get(ctx, d.epochKey()); err != nil || string(resp.Kvs[0].Value) != encodeGen(e) {
		t.Fatalf("epoch after a second Migrate: %v, %v", resp, err)
	}
	if _, err := d.cli.Put(ctx, d.schemaKey(), "4"); err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err == nil {
		t.Fatal("migrate over a newer layout succeeded")
	}
}

// TestOperationRecordRoundTrip: the record survives resources with spaces in their names.
func TestOperationRecordRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, op := range []driver.Operation{
		{OpID: "x", Outcome: driver.OutcomeAccepted, Resource: "a b  c", Epoch: 3, Generation: 9, RecordedAt: at},
		{OpID: "y", Outcome: driver.OutcomeAborted, RecordedAt: at},
	} {
		got, err := decodeOp(op.OpID, []byte(encodeOp(op)))
		if err != nil || got != op {
			t.Fatalf("round trip %+v: %+v, %v", op, got, err)
		}
	}
	for _, bad := range []string{"", "accepted", "aborted x", "accepted 1 2", "other 1", "aborted 1 2"} {
		if _, err := decodeOp("z", []byte(bad)); err == nil {
			t.Errorf("decodeOp(%q) succeeded", bad)
		}
	}
}

// TestNewClusterNeverReissues: a cluster lost entirely and created again from nothing (new
// members, new data directories) gets a store whose first token is greater than the last one
// of the old cluster, with no operator step: the epoch comes from the clock.
func TestNewClusterNeverReissues(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	run := func(ops func(d *Driver)) {
		c, err := startCluster(1)
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		cli := newClient(t, c.endpoints())
		d := New(cli, &Options{Prefix: "/fenced/"})
		if err := d.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Provision(ctx, "r ü"); err != nil {
			t.Fatal(err)
		}
		ops(d)
		_ = cli.Close()
	}
	var last driver.Grant
	run(func(d *Driver) {
		for i := range 3 {
			g, err := d.Acquire(ctx, "r ü", fmt.Sprintf("old-%d", i), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.BumpEpoch(ctx); err != nil {
				t.Fatal(err)
			}
			last = g
		}
		g, err := d.Acquire(ctx, "r ü", "old-last", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		last = g
	})
	run(func(d *Driver) {
		g, err := d.Acquire(ctx, "r ü", "new", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if g.Epoch < last.Epoch || g.Epoch == last.Epoch && g.Generation <= last.Generation {
			t.Fatalf("a new cluster issued %+v, not greater than %+v issued by the lost one", g, last)
		}
	})
}
