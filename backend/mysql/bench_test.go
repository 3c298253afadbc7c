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
// database/sql on the same database, each on a pool as Open sets it up (DefaultMaxIdleConns). Run with:
// go test -run '^$' -bench Protocol -benchtime 1s -count 6 ./backend/mysql/ and compare with
// benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	dbURL := CreateTestDatabase(b)
	open := func(b *testing.B) *Driver {
		d, err := Open(dbURL)
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

// raw is the baseline: the same statements executed directly, as hand-written code would. Its
// acquisition takes the generation from the reply and reads only the epoch after it; its
// publication is the same transaction driven from the client (SET TRANSACTION, START
// TRANSACTION, UPDATE, INSERT, COMMIT), where fenced calls it as one procedure.
type raw struct{ db *sql.DB }

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, bool, error) {
	p := &params{resource: resource, owner: owner, ttl: ttl.Microseconds()}
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return driver.Grant{}, false, err
	}
	defer conn.Close()
	res, err := conn.ExecContext(ctx, sqlAcquire.sql, p.values(sqlAcquire.args)...)
	if err != nil {
		return driver.Grant{}, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return driver.Grant{}, false, err
	}
	var g driver.Grant
	if g.Generation, err = res.LastInsertId(); err != nil {
		return g, false, err
	}
	err = conn.QueryRowContext(ctx, `SELECT @fenced_acquired_epoch`).Scan(&g.Epoch)
	return g, err == nil, err
}

func (r raw) publish(ctx context.Context, s *stmt, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	p := leaseParams(l)
	p.payload, p.sourceVersion, p.opID = pub.Payload, pub.SourceVersion, pub.OpID
	tx, err := r.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, s.first.sql, p.values(s.first.args)...)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, s.second.sql, p.values(s.second.args)...); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

func (r raw) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return r.publish(ctx, sqlPublish, l, pub)
}

func (r raw) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return r.publish(ctx, sqlPublishAndRelease, l, pub)
}

func (r raw) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	res, err := r.db.ExecContext(ctx, sqlRelease.sql, leaseParams(l).values(sqlRelease.args)...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}
