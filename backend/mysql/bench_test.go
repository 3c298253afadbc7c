package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// BenchmarkProtocol compares fenced on MySQL/MariaDB with the raw statements run through
// database/sql on the same database, each on a pool of 16 connections. Run with:
// go test -run '^$' -bench Protocol -benchtime 1s -count 6 ./backend/mysql/ and compare with
// benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	dbURL := CreateTestDatabase(b)
	open := func(b *testing.B) *Driver {
		d, err := Open(dbURL)
		if err != nil {
			b.Fatal(err)
		}
		d.DB().SetMaxOpenConns(16)
		d.DB().SetMaxIdleConns(16) // the default of 2 would reconnect on most calls at g16
		b.Cleanup(func() { _ = d.Close() })
		return d
	}
	drivertest.Bench(b, drivertest.BenchTarget{
		Open: func(b *testing.B) driver.Driver { return open(b) },
		Raw:  func(b *testing.B) drivertest.Raw { return raw{open(b).DB()} },
	})
}

// raw is the baseline: each statement executed directly, as hand-written code would. Its
// acquisition takes the generation from the reply and reads nothing after it.
type raw struct{ db *sql.DB }

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (int64, bool, error) {
	res, err := r.db.ExecContext(ctx, sqlAcquire, acquireArgs(resource, owner, ttl.Microseconds())...)
	if err != nil {
		return 0, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return 0, false, err
	}
	gen, err := res.LastInsertId()
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
	return r.exec(ctx, sqlPublish, publishArgs(resource, owner, gen, p)...)
}

func (r raw) PublishAndRelease(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.exec(ctx, sqlPublishAndRelease, publishArgs(resource, owner, gen, p)...)
}

func (r raw) Release(ctx context.Context, resource, owner string, gen int64) (bool, error) {
	return r.exec(ctx, sqlRelease, releaseArgs(resource, owner, gen)...)
}
