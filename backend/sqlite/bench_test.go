package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// BenchmarkProtocol compares fenced on SQLite with the raw statements run through database/sql
// on the same file. Run with: go test -run '^$' -bench Protocol -count 6 ./backend/sqlite/ and
// compare with benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.db")
	open := func(b *testing.B) *Driver {
		d, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.Close() })
		return d
	}
	drivertest.Bench(b, drivertest.BenchTarget{
		Open: func(b *testing.B) driver.Driver { return open(b) },
		Raw:  func(b *testing.B) drivertest.Raw { return raw{open(b).DB()} },
	})
}

// raw is the baseline: each statement executed directly, as hand-written code would.
type raw struct{ db *sql.DB }

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, bool, error) {
	var g driver.Grant
	var until int64
	err := r.db.QueryRowContext(ctx, sqlAcquire, resource, owner, ttl.Microseconds()).Scan(&g.Epoch, &g.Generation, &until)
	if errors.Is(err, sql.ErrNoRows) {
		return g, false, nil
	}
	return g, err == nil, err
}

// publish is the publication's transaction written out by hand.
func (r raw) publish(ctx context.Context, query string, l driver.LeaseRef, p driver.Publication) (bool, error) {
	args := []any{l.Resource, l.Owner, l.Generation, l.Epoch, p.Payload, p.SourceVersion, p.OpID}
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return false, err
	}
	res, err := conn.ExecContext(ctx, query, args...)
	if err == nil {
		if n, _ := res.RowsAffected(); n == 1 {
			_, err = conn.ExecContext(ctx, sqlRecordAccepted, args...)
		}
	}
	if err != nil {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		return false, err
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	return err == nil, err
}

func (r raw) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.publish(ctx, sqlPublish, l, p)
}

func (r raw) PublishAndRelease(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.publish(ctx, sqlPublishAndRelease, l, p)
}

func (r raw) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	res, err := r.db.ExecContext(ctx, sqlRelease, l.Resource, l.Owner, l.Generation, l.Epoch)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// BenchmarkGroupCommit measures acquire+release pairs through fenced on one goroutine and on 16
// goroutines with a resource each, with group commit (commit=group) and with the writer taking
// one operation per transaction as before group commit (commit=one), in the same run:
//
//	go test -run '^$' -bench GroupCommit -benchtime 1s -count 5 ./backend/sqlite/
func BenchmarkGroupCommit(b *testing.B) {
	for _, workers := range []int{1, 16} {
		for _, one := range []bool{false, true} {
			mode := "group"
			if one {
				mode = "one"
			}
			b.Run(fmt.Sprintf("g%d/commit=%s", workers, mode), func(b *testing.B) {
				d, err := Open(filepath.Join(b.TempDir(), "bench.db"))
				if err != nil {
					b.Fatal(err)
				}
				if one {
					d.w.mode = commitLegacy
				}
				store, err := fenced.New(context.Background(), d, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer store.Close()
				benchPairs(b, store, workers)
			})
		}
	}
}

// benchPairs runs acquire+release pairs on workers goroutines, each on its own resource, and
// reports pairs/s.
func benchPairs(b *testing.B, store *fenced.Store, workers int) {
	ctx := context.Background()
	var next atomic.Int64
	resource := func() string {
		name := fmt.Sprintf("pairs résource %d", next.Add(1))
		if err := store.Provision(ctx, name); err != nil {
			b.Fatal(err)
		}
		return name
	}
	pair := func(r string) bool {
		l, err := store.Acquire(ctx, r, time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		if err != nil {
			b.Error(err)
			return false
		}
		return true
	}
	if workers == 1 {
		r := resource()
		b.ResetTimer()
		for i := 0; i < b.N && pair(r); i++ {
		}
	} else {
		procs := runtime.GOMAXPROCS(0)
		b.SetParallelism((workers + procs - 1) / procs)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := resource()
			for pb.Next() && pair(r) {
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkSingleClient measures one client's acquire+release pair through fenced (group
// commit, a group of one) and through the raw statements (autocommit) on the same file, taking
// turns at every iteration so that both see the same disk and the same neighbours; the fsync
// time of a shared machine drifts by several times within seconds, which separate runs would
// mistake for a difference. Reports fenced-ns/pair, raw-ns/pair and fenced/raw.
//
//	go test -run '^$' -bench SingleClient -benchtime 2000x -count 3 ./backend/sqlite/
func BenchmarkSingleClient(b *testing.B) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "bench.db")
	d, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	store, err := fenced.New(ctx, d, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	r, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	rw := raw{r.DB()}
	if err := store.Provision(ctx, "fenced résource", "raw résource"); err != nil {
		b.Fatal(err)
	}
	var fencedNs, rawNs time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		l, err := store.Acquire(ctx, "fenced résource", time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		fencedNs += time.Since(start)
		start = time.Now()
		g, ok, err := rw.Acquire(ctx, "raw résource", fmt.Sprintf("owner %d", i), time.Minute)
		if err == nil && ok {
			ok, err = rw.Release(ctx, driver.LeaseRef{Resource: "raw résource", Owner: fmt.Sprintf("owner %d", i), Epoch: g.Epoch, Generation: g.Generation})
		}
		if err != nil || !ok {
			b.Fatalf("raw pair: %v %v", ok, err)
		}
		rawNs += time.Since(start)
	}
	b.ReportMetric(float64(fencedNs.Nanoseconds())/float64(b.N), "fenced-ns/pair")
	b.ReportMetric(float64(rawNs.Nanoseconds())/float64(b.N), "raw-ns/pair")
	b.ReportMetric(float64(fencedNs)/float64(rawNs), "fenced/raw")
}

// BenchmarkGroupCommitTurns runs 16 clients on 16 resources each, alternately with group commit
// and with every statement committed on its own, one at a time, as before group commit
// (commitLegacy), on two files side by side: each iteration is one slice of 16 x 10 pairs on
// each. Reports the pairs/s of both, group/one, and the operations per group commit.
//
//	go test -run '^$' -bench GroupCommitTurns -benchtime 20x -count 3 ./backend/sqlite/
func BenchmarkGroupCommitTurns(b *testing.B) {
	ctx := context.Background()
	var commits, ops atomic.Int64
	open := func(one bool) *fenced.Store {
		d, err := Open(filepath.Join(b.TempDir(), "bench.db"))
		if err != nil {
			b.Fatal(err)
		}
		if one {
			d.w.mode = commitLegacy
		} else {
			d.w.committed = func(n int, _ error) {
				commits.Add(1)
				ops.Add(int64(n))
			}
		}
		s, err := fenced.New(ctx, d, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		for w := range 16 {
			if err := s.Provision(ctx, fmt.Sprintf("turns résource %d", w)); err != nil {
				b.Fatal(err)
			}
		}
		return s
	}
	group, one := open(false), open(true)
	slice := func(s *fenced.Store) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				r := fmt.Sprintf("turns résource %d", w)
				for range 10 {
					l, err := s.Acquire(ctx, r, time.Minute)
					if err == nil {
						err = l.Release(ctx)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	var tg, to time.Duration
	commits.Store(0)
	ops.Store(0)
	b.ResetTimer()
	for range b.N {
		tg += slice(group)
		to += slice(one)
	}
	pairs := float64(b.N * 16 * 10)
	b.ReportMetric(pairs/tg.Seconds(), "group-pairs/s")
	b.ReportMetric(pairs/to.Seconds(), "one-pairs/s")
	b.ReportMetric(to.Seconds()/tg.Seconds(), "group/one")
	b.ReportMetric(float64(ops.Load())/float64(max(commits.Load(), 1)), "ops/commit")
}
