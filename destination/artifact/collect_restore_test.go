package artifact

import (
	"bytes"
	"errors"
	"testing"

	"github.com/fenced-dev/fenced"
)

// forEachRestorable is forEach on the homes whose rows the tests can restore to a copy.
func forEachRestorable(t *testing.T, fn func(t *testing.T, e *env)) {
	forEach(t, func(t *testing.T, e *env) {
		if e.home.copyRow == nil {
			t.Skipf("no row copy for %s", e.home.name)
		}
		fn(t, e)
	})
}

// restoredHolder: holder A uploads, and the row is copied while A holds it. A successor
// acquires, which supersedes A, so Collect decides to delete A's object; right before the
// deletion (the barrier), the row is restored to the copy, A is current again, and A publishes.
// It returns the reader's error, ErrMissing if the collector deleted A's object anyway, and
// Collect's own.
func restoredHolder(e *env) (readErr, collectErr error) {
	a := e.acquire()
	data := content("restored holder", 100)
	p, err := Upload(e.ctx, a, e.b, bytes.NewReader(data))
	if err != nil {
		e.t.Fatal(err)
	}
	restore, err := e.home.copyRow(e.ctx, resource)
	if err != nil {
		e.t.Fatal(err)
	}
	e.expire(resource)
	e.acquire() // supersedes A
	testHookBeforeDelete = func(key string) {
		testHookBeforeDelete = nil
		if key != p.Key {
			e.t.Errorf("collect is about to delete %q, want A's %q", key, p.Key)
		}
		if err := restore(e.ctx); err != nil {
			e.t.Error(err)
		}
	}
	defer func() { testHookBeforeDelete = nil }()
	_, collectErr = Collect(e.ctx, e.s, e.b, 0, false)
	if err := PublishPointer(e.ctx, a, p); err != nil {
		e.t.Fatalf("A, current again after the restore, publishes: %v", err)
	}
	got, err := e.readAll()
	if err == nil && !bytes.Equal(got, data) {
		e.t.Fatal("wrong bytes")
	}
	return err, collectErr
}

// A restore between Collect's decision and its deletion makes a superseded attempt current
// again: Collect reads the row again right before deleting, sees it went back, and deletes
// nothing, so the pointer that attempt then publishes names an object that exists.
func TestCollectRefusesARowRestoredBeforeDeletion(t *testing.T) {
	forEachRestorable(t, func(t *testing.T, e *env) {
		readErr, collectErr := restoredHolder(e)
		if !errors.Is(collectErr, ErrStoreWentBack) {
			t.Fatalf("collect across the restore: %v, want ErrStoreWentBack", collectErr)
		}
		if readErr != nil {
			t.Fatalf("read A's pointer: %v", readErr)
		}
	})
}

// Without the checks (the collector as it was before them), the same schedule leaves a
// published pointer to a deleted object.
func TestCollectRestoreCatchesTrustingCollector(t *testing.T) {
	collectTrustsRow = true
	defer func() { collectTrustsRow = false }()
	forEachRestorable(t, func(t *testing.T, e *env) {
		readErr, collectErr := restoredHolder(e)
		if collectErr != nil {
			t.Fatalf("the trusting collector: %v", collectErr)
		}
		if !errors.Is(readErr, ErrMissing) {
			t.Fatalf("with the trusting collector, the read returned %v; want ErrMissing", readErr)
		}
	})
}

// A collection that starts after a restore finds the evidence in the store, deletes nothing,
// and says to bump the epoch: an object uploaded under a token newer than the row, or (when
// that successor uploaded nothing) the newer acquisition recorded by an earlier collection.
// After `fenced epoch bump` it collects again.
func TestCollectAfterARestoreWantsAnEpochBump(t *testing.T) {
	for _, successorUploads := range []bool{true, false} {
		name := map[bool]string{true: "object newer than the row", false: "watermark"}[successorUploads]
		t.Run(name, func(t *testing.T) {
			forEachRestorable(t, func(t *testing.T, e *env) {
				a := e.acquire()
				old, err := Upload(e.ctx, a, e.b, bytes.NewReader(content("A", 10)))
				if err != nil {
					t.Fatal(err)
				}
				restore, err := e.home.copyRow(e.ctx, resource)
				if err != nil {
					t.Fatal(err)
				}
				e.expire(resource)
				b := e.acquire()
				if successorUploads {
					if _, err := Upload(e.ctx, b, e.b, bytes.NewReader(content("B", 10))); err != nil {
						t.Fatal(err)
					}
				}
				if !successorUploads {
					// An earlier collection sees B's acquisition (and deletes A's orphan: A is
					// superseded and the row has not gone back yet).
					if rep := e.collect(0); len(rep.Deleted) != 1 || rep.Deleted[0].Key != old.Key {
						t.Fatalf("collect before the restore: %+v", rep)
					}
					if _, err := Upload(e.ctx, a, e.b, bytes.NewReader(content("A again", 10))); err != nil {
						t.Fatal(err)
					}
					e.expire(resource)
				}
				if err := restore(e.ctx); err != nil {
					t.Fatal(err)
				}
				before := e.keys()
				_, err = Collect(e.ctx, e.s, e.b, 0, false)
				var wb *WentBackError
				if !errors.As(err, &wb) || !errors.Is(err, ErrStoreWentBack) {
					t.Fatalf("collect after the restore: %v, want ErrStoreWentBack", err)
				}
				t.Logf("%v", err)
				if after := e.keys(); len(after) != len(before) {
					t.Fatalf("collect deleted %q -> %q", before, after)
				}
				if _, err := e.s.BumpEpoch(e.ctx); err != nil {
					t.Fatal(err)
				}
				if err := PublishPointer(e.ctx, a, old); !errors.Is(err, fenced.ErrRefused) {
					t.Fatalf("A after the bump: %v, want refused", err)
				}
				if _, err := Collect(e.ctx, e.s, e.b, 0, false); err != nil {
					t.Fatalf("collect after the bump: %v", err)
				}
			})
		})
	}
}

// The same evidence must be able to fail: a collector that looks for none collects after the
// restore as if nothing had happened.
func TestCollectAfterARestoreCatchesTrustingCollector(t *testing.T) {
	collectTrustsRow = true
	defer func() { collectTrustsRow = false }()
	forEachRestorable(t, func(t *testing.T, e *env) {
		a := e.acquire()
		if _, err := Upload(e.ctx, a, e.b, bytes.NewReader(content("A", 10))); err != nil {
			t.Fatal(err)
		}
		restore, err := e.home.copyRow(e.ctx, resource)
		if err != nil {
			t.Fatal(err)
		}
		e.expire(resource)
		b := e.acquire()
		if _, err := Upload(e.ctx, b, e.b, bytes.NewReader(content("B", 10))); err != nil {
			t.Fatal(err)
		}
		if err := restore(e.ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := Collect(e.ctx, e.s, e.b, 0, false); err != nil {
			t.Fatalf("the trusting collector after a restore: %v, want no error (it sees no evidence)", err)
		}
	})
}
