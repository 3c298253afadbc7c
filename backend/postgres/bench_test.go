package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// BenchmarkProtocol compares fenced on PostgreSQL with the same statements run directly through
// a pgxpool of the same size (Open's default, DefaultMaxConns) on the same schema: the difference includes the
// incarnation check in each lease-carrying statement. The driver connects as the schema's
// owner, so it sends the statements (direct mode), not the routines. Run with:
// go test -run '^$' -bench Protocol -count 6 ./backend/postgres/ and compare with
// benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	rawURL := testSchema(b, nil)
	drivertest.Bench(b, drivertest.BenchTarget{
		Open: func(b *testing.B) driver.Driver { return openDriver(b, rawURL) },
		Raw:  func(b *testing.B) drivertest.Raw { return raw{openDriver(b, rawURL).Pool()} },
	})
}

// raw is the baseline: each statement executed directly, as hand-written code would, without
// the incarnation check, which hand-written code would not have: the difference is all that
// fenced adds, the check included.
type raw struct{ pool *pgxpool.Pool }

// withoutCheck is a statement without its incarnation check.
func withoutCheck(q string) string {
	bare := strings.ReplaceAll(q, " AND "+incarnationOK, "")
	if bare == q {
		panic("no incarnation check in " + q)
	}
	return bare
}

var (
	rawAcquire           = withoutCheck(sqlAcquire)
	rawPublish           = withoutCheck(sqlPublish)
	rawPublishAndRelease = withoutCheck(sqlPublishAndRelease)
	rawRelease           = withoutCheck(sqlRelease)
)

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, bool, error) {
	var (
		g                  driver.Grant
		acquired, seenFree bool
		until              pgtype.Timestamptz
	)
	err := r.pool.QueryRow(ctx, rawAcquire, resource, owner, ttl.Microseconds()).Scan(&acquired, &g.Epoch, &g.Generation, &until, &seenFree)
	return g, err == nil && acquired, err
}

func (r raw) exec(ctx context.Context, query string, args ...any) (bool, error) {
	tag, err := r.pool.Exec(ctx, query, args...)
	return err == nil && tag.RowsAffected() == 1, err
}

// Publish is the same single statement as the driver's: the conditional UPDATE and the record
// of the operation id.
func (r raw) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.exec(ctx, rawPublish, l.Resource, l.Owner, l.Generation, l.Epoch, p.Payload, p.SourceVersion, p.OpID)
}

func (r raw) PublishAndRelease(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.exec(ctx, rawPublishAndRelease, l.Resource, l.Owner, l.Generation, l.Epoch, p.Payload, p.SourceVersion, p.OpID)
}

func (r raw) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return r.exec(ctx, rawRelease, l.Resource, l.Owner, l.Generation, l.Epoch)
}
