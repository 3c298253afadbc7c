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
