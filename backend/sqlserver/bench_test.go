package sqlserver

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// BenchmarkProtocol compares fenced on SQL Server with the raw statements run through
// database/sql on the same schema. It needs FENCED_TEST_SQLSERVER. Run with:
// go test -run '^$' -bench Protocol -count 6 ./backend/sqlserver/ and compare with
// benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	_, schemaURL := newSchema(b, serverURL(b))
	open := func(b *testing.B) *Driver {
		d, err := Open(schemaURL)
		if err != nil {
			b.Fatal(err)
		}
		d.DB().SetMaxIdleConns(16) // serve the 16 goroutines without reconnecting
		b.Cleanup(func() { _ = d.Close() })
		return d
	}
	drivertest.Bench(b, drivertest.BenchTarget{
		Open: func(b *testing.B) driver.Driver { return open(b) },
		Raw: func(b *testing.B) drivertest.Raw {
			d := open(b)
			return raw{d.DB(), d.sql}
		},
	})
}

// raw is the baseline: each statement executed directly, as hand-written code would, with the
// same text and parameters as the driver but none of its checks or retries. Its acquisition
// is the UPDATE alone, without the read that explains a refusal.
type raw struct {
	db  *sql.DB
	sql statements
}

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (int64, bool, error) {
	args, err := acquireArgs(resource, owner, ttl)
	if err != nil {
		return 0, false, err
	}
	var (
		gen      int64
		until    time.Time
		acquired int64
	)
	err = r.db.QueryRowContext(ctx, r.sql.acquireUpdate, args...).Scan(&gen, &until, &acquired)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return gen, err == nil, err
}

func (r raw) exec(ctx context.Context, query string, args []any) (bool, error) {
	res, err := r.db.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func ref(resource, owner string, gen int64) driver.LeaseRef {
	return driver.LeaseRef{Resource: resource, Owner: owner, Generation: gen}
}

func (r raw) Publish(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.exec(ctx, r.sql.publish, publishArgs(ref(resource, owner, gen), p))
}

func (r raw) PublishAndRelease(ctx context.Context, resource, owner string, gen int64, p []byte) (bool, error) {
	return r.exec(ctx, r.sql.publishAndRelease, publishArgs(ref(resource, owner, gen), p))
}

func (r raw) Release(ctx context.Context, resource, owner string, gen int64) (bool, error) {
	return r.exec(ctx, r.sql.release, leaseArgs(ref(resource, owner, gen)))
}
