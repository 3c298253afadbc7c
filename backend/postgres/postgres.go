// Package postgres runs the fenced protocol on PostgreSQL through pgx.
//
// Every operation is one autocommit statement; the one transaction (migration) is serialized by
// a transaction-scoped advisory lock. Expiry is judged by the server's clock_timestamp(), never
// by now(), which is frozen at the start of a transaction (see sql.go). Tables are not
// schema-qualified, so the connection's search_path chooses the schema.
//
// The statements are correct at every isolation level. Under REPEATABLE READ and SERIALIZABLE
// (for instance as default_transaction_isolation), a statement that meets a concurrent update
// fails with a serialization failure instead of waiting and re-checking; since each statement
// is its own transaction, such a failure means it was rolled back, and the driver runs it again
// a bounded number of times, so the losers of a race still see "busy" rather than an error.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced/driver"
)

//go:embed migrations/*.sql
var migrations embed.FS

// maxAttempts bounds how often a statement that was rolled back by a serialization failure or
// a deadlock is run again.
const maxAttempts = 5

// Driver is the PostgreSQL backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	pool  *pgxpool.Pool
	owned bool
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a pool the caller opened and keeps ownership of: Close leaves it
// open.
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// Open connects to the server at a postgres:// or postgresql:// URL (pgxpool's parameters,
// such as pool_max_conns, and runtime parameters such as search_path are accepted). The
// returned driver owns its pool and closes it in Close.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	if !strings.HasPrefix(rawURL, "postgres://") && !strings.HasPrefix(rawURL, "postgresql://") {
		return nil, errors.New("open postgres: the URL does not start with postgres:// or postgresql://")
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		// pgx's parse errors already hide the password.
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return &Driver{pool: pool, owned: true}, nil
}

// Pool returns the underlying pool.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Close closes the pool if Open created it.
func (d *Driver) Close() error {
	if d.owned {
		d.pool.Close()
	}
	return nil
}

// Migrate applies the embedded migrations that have not run yet, in one transaction that first
// takes an advisory lock, so that concurrent calls apply each migration once. The transaction
// is READ COMMITTED whatever the server's default, so that reads after the lock wait see what
// the previous holder committed.
func (d *Driver) Migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return interpretError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, sqlMigrateLock, int64(migrateLockKey)); err != nil {
		return fmt.Errorf("lock migrations: %w", interpretError(err))
	}
	if _, err := tx.Exec(ctx, sqlMigrationsTable); err != nil {
		return fmt.Errorf("create migrations table: %w", interpretError(err))
	}
	var current int
	if err := tx.QueryRow(ctx, sqlMigrationsCurrent).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", interpretError(err))
	}
	for _, name := range names {
		version, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, "migrations/"), "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migration %s: bad version: %w", name, err)
		}
		if version <= current {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", name, interpretError(err))
		}
		if _, err := tx.Exec(ctx, sqlMigrationsRecord, version); err != nil {
			return fmt.Errorf("record migration %s: %w", name, interpretError(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit migrations: %w", interpretError(err))
	}
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	return d.retry(ctx, func() error {
		_, err := d.pool.Exec(ctx, sqlProvision, resource)
		return err
	})
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	var (
		acquired, seenFree bool
		gen                int64
		until              pgtype.Timestamptz
	)
	err := d.retry(ctx, func() error {
		return d.pool.QueryRow(ctx, sqlAcquire, resource, owner, ttl.Microseconds()).
			Scan(&acquired, &gen, &until, &seenFree)
	})
	if err != nil {
		return driver.Grant{}, err // ErrNotFound when the resource has no row
	}
	if acquired {
		return driver.Grant{Generation: gen, LeaseUntil: timeOf(until)}, nil
	}
	if seenFree {
		// Refused after waiting on a concurrent acquisition: the statement's snapshot predates
		// the winner, so read the row again to name the holder.
		st, err := d.Read(ctx, resource)
		if err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{}, &driver.BusyError{Generation: st.Generation, LeaseUntil: st.LeaseUntil}
	}
	return driver.Grant{}, &driver.BusyError{Generation: gen, LeaseUntil: timeOf(until)}
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	var until pgtype.Timestamptz
	err := d.retry(ctx, func() error {
		return d.pool.QueryRow(ctx, sqlRenew, l.Resource, l.Owner, l.Generation, ttl.Microseconds()).Scan(&until)
	})
	if errors.Is(err, driver.ErrNotFound) { // no row matched: refused
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return timeOf(until), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	return d.execOne(ctx, sqlPublish, l.Resource, l.Owner, l.Generation, nonNil(payload))
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	return d.execOne(ctx, sqlPublishAndRelease, l.Resource, l.Owner, l.Generation, nonNil(payload))
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return d.execOne(ctx, sqlRelease, l.Resource, l.Owner, l.Generation)
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	var (
		st                 driver.State
		owner              pgtype.Text
		until, publishedAt pgtype.Timestamptz
		now                time.Time
	)
	err := d.retry(ctx, func() error {
		st = driver.State{Resource: resource}
		return d.pool.QueryRow(ctx, sqlRead, resource).Scan(&st.Generation, &owner, &until,
			&st.PublishedGeneration, &publishedAt, &st.PayloadSize, &now)
	})
	if err != nil {
		return driver.State{}, err
	}
	st.Owner = owner.String
	st.LeaseUntil = timeOf(until)
	st.PublishedAt = timeOf(publishedAt)
	st.Now = now.UTC()
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	var (
		gen     int64
		payload []byte
	)
	err := d.retry(ctx, func() error {
		return d.pool.QueryRow(ctx, sqlReadPayload, resource).Scan(&gen, &payload)
	})
	if err != nil {
		return nil, 0, err
	}
	return payload, gen, nil
}

// execOne runs a conditional UPDATE; ok is true when it changed exactly one row.
func (d *Driver) execOne(ctx context.Context, query string, args ...any) (bool, error) {
	var tag pgconn.CommandTag
	err := d.retry(ctx, func() (err error) {
		tag, err = d.pool.Exec(ctx, query, args...)
		return err
	})
	if err != nil {
		return false, err
	}
	if n := tag.RowsAffected(); n > 1 {
		return false, fmt.Errorf("statement changed %d rows; the resource key is not unique", n)
	}
	return tag.RowsAffected() == 1, nil
}

// retry runs one autocommit statement, again while the server reports that it was rolled back
// by a serialization failure or a deadlock (so it certainly did not take effect), at most
// maxAttempts times. The error it returns has passed through interpretError.
func (d *Driver) retry(ctx context.Context, statement func() error) error {
	err := statement()
	for attempt := 1; attempt < maxAttempts && rolledBack(err) && ctx.Err() == nil; attempt++ {
		err = statement()
	}
	return interpretError(err)
}

// rolledBack reports whether err is the server's report that the transaction was aborted so
// that it could be retried: serialization failure (40001) or deadlock (40P01).
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// interpretError is where pgx's errors become the driver's: no row is ErrNotFound, and a
// statement still rolled back after every attempt says so. Everything else is returned as it
// is; it is never turned into a refusal.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return driver.ErrNotFound
	case rolledBack(err):
		return fmt.Errorf("run statement: rolled back by the server on every attempt, not applied: %w", err)
	}
	return err
}

// timeOf turns a nullable timestamp into a time in UTC, the zero time for NULL.
func timeOf(ts pgtype.Timestamptz) time.Time {
	if !ts.Valid {
		return time.Time{}
	}
	return ts.Time.UTC()
}

// nonNil stores an empty payload as an empty bytea rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// TODO(issue 4): the recovery features below are being implemented for this backend; until then
// they fail loudly and the conformance suite's tests for them fail.
var errIssue4Pending = errors.New("postgres backend: epochs, operation ids and source versions are not implemented yet")

func (d *Driver) ResolveOperation(context.Context, string) (driver.Operation, error) {
	return driver.Operation{}, errIssue4Pending
}

func (d *Driver) ReadOperation(context.Context, string) (driver.Operation, error) {
	return driver.Operation{}, errIssue4Pending
}

func (d *Driver) BumpEpoch(context.Context) (int64, error) { return 0, errIssue4Pending }

func (d *Driver) PruneOperations(context.Context, time.Duration) (int64, error) {
	return 0, errIssue4Pending
}
