package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// groupDriver opens a migrated store whose epoch was bumped (so that epoch != generation) and
// provisions the resources.
func groupDriver(t *testing.T, resources ...string) *Driver {
	t.Helper()
	ctx := context.Background()
	d, err := Open(filepath.Join(t.TempDir(), "group.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range resources {
		if err := d.Provision(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// holdWriter makes the writer wait, before it takes the queue, until n operations are queued:
// the barrier that puts them all in one group. It returns the sizes of the transactions the
// writer then commits.
func holdWriter(d *Driver, n int) (commits func() []int) {
	var (
		mu     sync.Mutex
		sizes  []int
		queued = make(chan struct{})
		once   sync.Once
		full   sync.Once
	)
	setHooks(d, func(w *writer) {
		w.queued = func(k int) {
			if k == n {
				full.Do(func() { close(queued) })
			}
		}
		w.beforeTake = func() { once.Do(func() { <-queued }) }
		w.committed = func(k int, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				sizes = append(sizes, k)
			} else {
				sizes = append(sizes, -abs(k)) // a failed transaction
			}
		}
	})
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), sizes...)
	}
}

// groupScenario queues, behind the barrier, acquisitions of distinct resources, two
// acquisitions of one resource, and poisons operations whose first statement writes and whose
// second fails; it returns what went wrong. Without poison the group is one transaction. With
// two, the first makes the writer roll the group back and run the rest again with savepoints,
// where the second is undone to its savepoint: two transactions, the first rolled back.
func groupScenario(t *testing.T, poisons int, mutate func(*Driver)) (problems []string) {
	ctx := context.Background()
	distinct := []string{"res one", "rés två", "ресурс 3", "資源 4"}
	const contested = "contested\x00 one"
	poisoned := make([]string, poisons)
	for i := range poisoned {
		poisoned[i] = fmt.Sprintf("poisoned résource %d", i)
	}
	d := groupDriver(t, append(append(distinct, contested), poisoned...)...)
	mutate(d)
	before := make([]driver.State, poisons)
	for i, r := range poisoned {
		var err error
		if before[i], err = d.Read(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	n := len(distinct) + 2 + poisons
	commits := holdWriter(d, n)

	var wg sync.WaitGroup
	grants := make([]error, len(distinct))
	for i, r := range distinct {
		wg.Go(func() {
			_, grants[i] = d.Acquire(ctx, r, fmt.Sprintf("owner %d", i), time.Minute)
		})
	}
	contestedErrs := make([]error, 2)
	for i := range contestedErrs {
		wg.Go(func() {
			_, contestedErrs[i] = d.Acquire(ctx, contested, fmt.Sprintf("rival %d", i), time.Minute)
		})
	}
	poisonErrs := make([]error, poisons)
	for i, r := range poisoned {
		wg.Go(func() {
			poisonErrs[i] = d.exec(ctx, func(ctx context.Context, q querier) error {
				if _, err := q.ExecContext(ctx, `UPDATE fenced_resources SET payload = X'00ff00', published_generation = 99 WHERE resource = ?`, r); err != nil {
					return err
				}
				_, err := q.ExecContext(ctx, `INSERT INTO fenced_resources (resource) VALUES (?)`, r) // duplicate key
				return err
			})
		})
	}
	wg.Wait()

	want := []int{n}
	if poisons > 0 {
		want = []int{-n, n - 1}
	}
	if got := commits(); fmt.Sprint(got) != fmt.Sprint(want) {
		problems = append(problems, fmt.Sprintf("transactions of sizes %v, want %v", got, want))
	}
	for i, err := range grants {
		if err != nil {
			problems = append(problems, fmt.Sprintf("acquire of %q: %v", distinct[i], err))
		}
	}
	var busy *driver.BusyError
	switch a, b := contestedErrs[0], contestedErrs[1]; {
	case a == nil && errors.As(b, &busy), b == nil && errors.As(a, &busy):
	default:
		problems = append(problems, fmt.Sprintf("two acquisitions of one resource in one group: %v and %v, want one granted and one busy", a, b))
	}
	for i, r := range poisoned {
		if err := poisonErrs[i]; err == nil || !errors.Is(err, driver.ErrNotApplied) {
			problems = append(problems, fmt.Sprintf("failing operation %d returned %v, want a not-applied error", i, err))
		}
		after, err := d.Read(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if after.PublishedGeneration != before[i].PublishedGeneration || after.PayloadSize != before[i].PayloadSize {
			problems = append(problems, fmt.Sprintf("failing operation %d's first statement was committed: published generation %d, payload %d bytes",
				i, after.PublishedGeneration, after.PayloadSize))
		}
	}
	for i, r := range distinct {
		st, err := d.Read(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if st.Owner != fmt.Sprintf("owner %d", i) || st.Generation != 1 || st.Epoch == st.Generation {
			problems = append(problems, fmt.Sprintf("%q after the group: %+v", r, st))
		}
	}
	return problems
}

// TestGroupCommit: operations queued behind the writer are applied in one transaction, each its
// own conditional statement seeing the ones before it; one that fails is undone alone, and the
// others are applied once.
func TestGroupCommit(t *testing.T) {
	for _, poisons := range []int{0, 2} {
		t.Run(fmt.Sprintf("failing=%d", poisons), func(t *testing.T) {
			for _, p := range groupScenario(t, poisons, func(*Driver) {}) {
				t.Error(p)
			}
		})
	}
}

// The scenario must be able to fail: one transaction per operation (as before group commit),
// going on after a failure without running the rest again, and a savepoint not rolled back to
// are each caught.
func TestGroupScenarioCatches(t *testing.T) {
	for _, m := range []struct {
		name    string
		poisons int
		set     func(*writer)
		caught  string
	}{
		{"one transaction per operation", 0, func(w *writer) { w.mode = commitOne }, "transactions of sizes"},
		// Which of the two failing operations reaches the savepoints depends on the queue's order.
		{"no redo after a failure", 2, func(w *writer) { w.noRedo = true }, "first statement was committed"},
		{"no rollback to the savepoint", 2, func(w *writer) { w.noRollbackTo = true }, "first statement was committed"},
	} {
		t.Run(m.name, func(t *testing.T) {
			problems := groupScenario(t, m.poisons, func(d *Driver) { setHooks(d, m.set) })
			if !containsText(problems, m.caught) {
				t.Fatalf("not caught; problems: %q", problems)
			}
		})
	}
}

func setHooks(d *Driver, set func(*writer)) {
	d.w.mu.Lock()
	defer d.w.mu.Unlock()
	set(&d.w)
}

func abs(n int) int { return max(n, -n) }

func containsText(list []string, text string) bool {
	for _, s := range list {
		if strings.Contains(s, text) {
			return true
		}
	}
	return false
}

// TestGroupFailedCommit: when COMMIT fails and SQLite rolled back, every operation of the
// group reports not applied, nothing of it is in the file, and the driver goes on working.
// The COMMIT is made to fail by a deferred foreign key that one operation violates.
func TestGroupFailedCommit(t *testing.T) {
	ctx := context.Background()
	resources := []string{"a resource", "ресурс"}
	d := groupDriver(t, resources...)
	for _, stmt := range []string{
		`CREATE TABLE test_parent (id INTEGER PRIMARY KEY)`,
		`CREATE TABLE test_child (p INTEGER REFERENCES test_parent (id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if _, err := d.DB().ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	n := len(resources) + 1
	commits := holdWriter(d, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, r := range resources {
		wg.Go(func() { _, errs[i] = d.Acquire(ctx, r, "owner", time.Minute) })
	}
	wg.Go(func() {
		errs[n-1] = d.exec(ctx, func(ctx context.Context, q querier) error {
			_, err := q.ExecContext(ctx, `INSERT INTO test_child (p) VALUES (42)`)
			return err // succeeds; the foreign key is checked at COMMIT
		})
	})
	wg.Wait()
	if got := commits(); len(got) != 1 || got[0] != -n {
		t.Fatalf("transactions %v, want one failed transaction of %d operations", got, n)
	}
	for i, err := range errs {
		if !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("operation %d: %v, want not applied", i, err)
		}
	}
	for _, r := range resources {
		st, err := d.Read(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if st.Generation != 0 || st.Owner != "" {
			t.Errorf("%q after a failed commit: %+v", r, st)
		}
	}
	setHooks(d, func(w *writer) { w.committed = nil })
	g, err := d.Acquire(ctx, resources[0], "after", time.Minute)
	if err != nil || g.Generation != 1 {
		t.Fatalf("acquire after the failed group: %+v, %v", g, err)
	}
}

// TestGroupCancelledWhileQueued: a caller that gives up while its operation waits in the queue
// (behind a writer held at the barrier) gets not applied, and the operation never runs.
func TestGroupCancelledWhileQueued(t *testing.T) {
	ctx := context.Background()
	d := groupDriver(t, "a resource")
	hold := make(chan struct{})
	var once sync.Once
	queued := make(chan int, 2)
	setHooks(d, func(w *writer) {
		w.beforeTake = func() { once.Do(func() { <-hold }) }
		w.queued = func(n int) { queued <- n }
	})
	first := make(chan error)
	go func() { first <- d.exec(ctx, func(context.Context, querier) error { return nil }) }()
	<-queued // the first caller writes; it waits at the barrier
	cctx, cancel := context.WithCancel(ctx)
	var ran atomic.Bool
	done := make(chan error)
	go func() {
		done <- d.exec(cctx, func(context.Context, querier) error { ran.Store(true); return nil })
	}()
	if n := <-queued; n != 2 {
		t.Fatalf("queue of %d, want 2", n)
	}
	cancel()
	err := <-done
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, driver.ErrNotApplied) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while queued: %v, want not applied", err)
	}
	if ran.Load() {
		t.Fatal("the cancelled operation ran")
	}
}

// TestGatherWokenCallers: after a commit that woke several callers, the writer waits for their
// next operations instead of taking the queue at once, so that they share the next commit.
// Each caller queues a second operation as soon as its first returned, but the test holds
// those until the writer either starts gathering or stops; without gathering (the mutation)
// the writer stops between the two groups.
func TestGatherWokenCallers(t *testing.T) {
	const m = 4
	for _, mutant := range []bool{false, true} {
		t.Run(fmt.Sprintf("mutant=%v", mutant), func(t *testing.T) {
			ctx := context.Background()
			resources := []string{"gather one", "gather två", "ресурс три", "資源 四"}
			d := groupDriver(t, resources...)
			commits := holdWriter(d, m)
			var stopped atomic.Bool
			second := make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(second) }) }
			setHooks(d, func(w *writer) {
				w.gatherLimit = time.Minute // the window ends only when the woken callers are back
				if mutant {
					w.gatherLimit = -1
				}
				w.gathering = release
				var n atomic.Int32 // transactions committed
				w.stopped = func() {
					if n.Load() < 2 {
						stopped.Store(true)
					}
					release()
				}
				held := w.committed
				w.committed = func(k int, err error) { // runs without w.mu held
					held(k, err)
					if n.Add(1) == 2 { // no window after the last group: the test ends
						setHooks(d, func(w *writer) { w.gatherLimit = -1 })
					}
				}
			})
			var wg sync.WaitGroup
			errs := make([]error, m)
			for i, r := range resources {
				wg.Go(func() {
					g, err := d.Acquire(ctx, r, "gatherer", time.Minute)
					if err != nil {
						errs[i] = err
						return
					}
					<-second
					_, errs[i] = d.Release(ctx, driver.LeaseRef{Resource: r, Owner: "gatherer", Epoch: g.Epoch, Generation: g.Generation})
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
			got := commits()
			caught := stopped.Load() || fmt.Sprint(got) != fmt.Sprint([]int{m, m})
			if caught != mutant {
				t.Fatalf("mutant=%v: transactions %v, writer stopped between them: %v; want [%d %d] without a stop",
					mutant, got, stopped.Load(), m, m)
			}
		})
	}
}

// TestGatherGrantedOnly: the gathering window waits only for callers whose operation was
// granted. Four acquisitions of one resource share a group (the barrier): one is granted, three
// are refused. A refused caller does not come back at once, so the writer must not go on to
// wait for four operations: once every caller has its answer, no writer runs. The mutant that
// counts the refused callers keeps a writer waiting (in the test, a minute; in production, up
// to maxGather after every commit on a hot resource); the test then fills its window with four
// empty operations so that it ends.
func TestGatherGrantedOnly(t *testing.T) {
	const m = 4
	for _, mutant := range []bool{false, true} {
		t.Run(fmt.Sprintf("mutant=%v", mutant), func(t *testing.T) {
			ctx := context.Background()
			const hot = "hot\x00 ресурс"
			d := groupDriver(t, hot)
			commits := holdWriter(d, m)
			setHooks(d, func(w *writer) {
				w.gatherLimit = time.Minute // a window ends only when its callers are back
				w.gatherRefused = mutant
			})
			var (
				wg              sync.WaitGroup
				granted, busy   atomic.Int32
				errMu           sync.Mutex
				unexpectedError error
			)
			for i := range m {
				wg.Go(func() {
					_, err := d.Acquire(ctx, hot, fmt.Sprintf("rival %d", i), time.Minute)
					switch {
					case err == nil:
						granted.Add(1)
					case errors.As(err, new(*driver.BusyError)):
						busy.Add(1)
					default:
						errMu.Lock()
						unexpectedError = err
						errMu.Unlock()
					}
				})
			}
			wg.Wait()
			if unexpectedError != nil {
				t.Fatal(unexpectedError)
			}
			if granted.Load() != 1 || busy.Load() != m-1 || fmt.Sprint(commits()) != fmt.Sprint([]int{m}) {
				t.Fatalf("granted %d, busy %d, transactions %v; want 1, %d, [%d]", granted.Load(), busy.Load(), commits(), m-1, m)
			}
			// Every caller has its answer, and the lead caller decided before it returned
			// whether a writer goes on.
			d.w.mu.Lock()
			waiting := d.w.running
			d.w.mu.Unlock()
			if waiting != mutant {
				t.Fatalf("mutant=%v: a writer goes on after the group: %v", mutant, waiting)
			}
			if !waiting {
				return
			}
			setHooks(d, func(w *writer) { w.gatherLimit = -1 }) // no window after this one
			for range m {
				wg.Go(func() {
					if err := d.exec(ctx, func(context.Context, querier) error { return nil }); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestWriterKeepsItsStatements: the writer's statements outlive their group. A cycle on one
// resource prepares its statements; the same cycles on another resource and on the first again,
// each in groups of their own, prepare none; a read's statement is kept too. After Close the
// writer refuses, as not applied.
func TestWriterKeepsItsStatements(t *testing.T) {
	ctx := context.Background()
	d := groupDriver(t, "kept ü", "kept two ö")
	cycle := func(resource string) {
		t.Helper()
		g, err := d.Acquire(ctx, resource, "owner", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		l := driver.LeaseRef{Resource: resource, Owner: "owner", Epoch: g.Epoch, Generation: g.Generation}
		if ok, err := d.PublishAndRelease(ctx, l, driver.Publication{Payload: []byte("p\x00q"), OpID: fmt.Sprintf("op %s %d", resource, g.Generation)}); err != nil || !ok {
			t.Fatalf("publish and release: %v, %v", ok, err)
		}
	}
	prepared := func() int {
		d.wc.mu.Lock()
		defer d.wc.mu.Unlock()
		return d.wc.prepared
	}
	cycle("kept ü")
	first := prepared()
	if first == 0 {
		t.Fatal("the writer prepared no statement")
	}
	cycle("kept two ö")
	cycle("kept ü")
	if n := prepared(); n != first {
		t.Fatalf("the same cycles prepared %d statements more: the writer did not keep them", n-first)
	}
	// A read's statement is prepared once too.
	stmtOf := func() *sql.Stmt {
		t.Helper()
		if _, err := d.Read(ctx, "kept ü"); err != nil {
			t.Fatal(err)
		}
		d.readsMu.Lock()
		defer d.readsMu.Unlock()
		return d.reads[d.q(sqlRead)]
	}
	if st := stmtOf(); st == nil || stmtOf() != st {
		t.Fatal("the read's statement was not kept")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, "kept ü", "owner", time.Minute); !errors.Is(err, driver.ErrNotApplied) || !errors.Is(err, errDriverClosed) {
		t.Fatalf("acquire after Close: %v, want a not-applied errDriverClosed", err)
	}
}

// TestWriterLeavesTheOnlyConnection: on a handle limited to one connection, the writer gives
// its connection back after each group, so a read after a write does not wait forever for it.
func TestWriterLeavesTheOnlyConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sql.Open("sqlite", DSN(filepath.Join(t.TempDir(), "one.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	d := New(db)
	defer d.Close()
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	const resource = "one connection ü"
	if err := d.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, resource, "owner", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Read(ctx, resource)
	if err != nil {
		t.Fatalf("read after a write on a one-connection handle: %v", err)
	}
	if st.Owner != "owner" || st.Generation != g.Generation || st.Epoch != g.Epoch {
		t.Fatalf("read %+v after acquiring %+v", st, g)
	}
}
