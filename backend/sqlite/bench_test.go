package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

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

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (int64, bool, error) {
	var gen, until int64
	err := r.db.QueryRowContext(ctx, sqlAcquire, resource, owner, ttl.Microseconds()).Scan(&gen, &until)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return gen, err == nil, err
}

func (r raw) exec(ctx context.Context, query string, args ...any) (bool, error) {
	res, err := r.db.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (r raw) Publish(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.exec(ctx, sqlPublish, resource, owner, gen, p)
}

func (r raw) PublishAndRelease(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.exec(ctx, sqlPublishAndRelease, resource, owner, gen, p)
}

func (r raw) Release(ctx context.Context, resource, owner string, gen int64) (bool, error) {
	return r.exec(ctx, sqlRelease, resource, owner, gen)
}
