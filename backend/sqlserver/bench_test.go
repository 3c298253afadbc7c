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

// raw is the baseline: each statement executed directly on the pool, as hand-written code
// would, with the same text and parameters as the driver (the publication's transaction with
// the record of its operation id included) but none of its checks, retries, dedicated
// connections or error classification. Its acquisition is the UPDATE alone, without the read
// that explains a refusal.
type raw struct {
	db  *sql.DB
	sql statements
}

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, bool, error) {
	args, err := acquireArgs(resource, owner, ttl)
	if err != nil {
		return driver.Grant{}, false, err
	}
	var (
		g        driver.Grant
		acquired int64
	)
	err = r.db.QueryRowContext(ctx, r.sql.acquireUpdate, args...).Scan(&g.Epoch, &g.Generation, &g.LeaseUntil, &acquired)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.Grant{}, false, nil
	}
	return g, err == nil, err
}

func (r raw) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.count(ctx, r.sql.text[opPublish], publishArgs(l, p))
}

func (r raw) PublishAndRelease(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.count(ctx, r.sql.text[opPublishAndRelease], publishArgs(l, p))
}

// Release counts the OUTPUT row of the conditional UPDATE.
func (r raw) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	var gen int64
	err := r.db.QueryRowContext(ctx, r.sql.text[opRelease], leaseArgs(l)...).Scan(&gen)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// count reads a publication batch's answer, the number of rows it published.
func (r raw) count(ctx context.Context, query string, args []any) (bool, error) {
	var n int64
	if err := r.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return false, err
	}
	return n == 1, nil
}
