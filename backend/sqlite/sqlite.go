// Package sqlite runs the fenced protocol on an SQLite database file: the embedded default,
// with nothing to set up.
//
// Every operation is one autocommit statement. A single writing statement takes SQLite's write
// lock when it starts, so the busy timeout applies to it; the one multi-statement transaction
// (migration) begins with BEGIN IMMEDIATE for the same reason. Expiry is judged by SQLite's
// clock (the clock of the machine running the process that executes the statement), so every
// process that shares the file must share that machine's clock: the file is for one host.
package sqlite

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"

	"modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// Driver is the SQLite backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	db    *sql.DB
	owned bool
	clock string // replaces nowMicros in every statement when set (WithClockOffsetFile)
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a handle the caller opened and keeps ownership of. The handle must
// use the "sqlite" driver (modernc.org/sqlite) with a busy timeout, WAL journal mode and
// synchronous=FULL on every connection; DSN builds a data source name that does so.
func New(db *sql.DB) *Driver { return &Driver{db: db} }

// DSN returns the data source name Open uses for the database file at path: WAL,
// synchronous=FULL (so an acknowledged generation survives power loss), a 10 s busy timeout,
// foreign keys on, and BEGIN IMMEDIATE for transactions.
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// Open opens (creating if needed) the database file at path. The returned driver owns the
// handle and closes it in Close.
func Open(path string, opts ...Option) (*Driver, error) {
	if path == "" {
		return nil, errors.New("open sqlite: the path is empty")
	}
	d := &Driver{owned: true}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, fmt.Errorf("open sqlite %s: %w", path, err)
		}
	}
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	d.db = db
	return d, nil
}

// Option changes how Open sets up the driver.
type Option func(*Driver) error

// WithClockOffsetFile makes every statement judge time by SQLite's clock plus an offset read,
// at each statement, from the file at path: a decimal number of microseconds, possibly
// negative; a missing or empty file means 0. It exists so that a fault injector (fenced
// torture) can jump the clock of every process sharing the database at once. Without it the
// statements read SQLite's clock directly, as always.
func WithClockOffsetFile(path string) Option {
	return func(d *Driver) error {
		if err := registerClockOffset(); err != nil {
			return fmt.Errorf("register clock offset function: %w", err)
		}
		d.clock = "(" + nowMicros + " + fenced_clock_offset_us('" + strings.ReplaceAll(path, "'", "''") + "'))"
		return nil
	}
}

var registerClockOffset = sync.OnceValue(func() error {
	// Registered once per process; it is available to connections opened afterwards.
	return sqlite.RegisterScalarFunction("fenced_clock_offset_us", 1,
		func(_ *sqlite.FunctionContext, args []sqldriver.Value) (sqldriver.Value, error) {
			path, _ := args[0].(string)
			b, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				return int64(0), nil
			}
			if err != nil {
				return nil, err
			}
			s := strings.TrimSpace(string(b))
			if s == "" {
				return int64(0), nil
			}
			return strconv.ParseInt(s, 10, 64)
		})
})

// q returns a statement as this driver runs it: unchanged unless a clock offset is set.
func (d *Driver) q(statement string) string {
	if d.clock == "" {
		return statement
	}
	return strings.ReplaceAll(statement, nowMicros, d.clock)
}

// OpenURL opens a URL of the form sqlite:PATH (or sqlite://PATH).
func OpenURL(rawURL string) (*Driver, error) {
	path, ok := strings.CutPrefix(rawURL, "sqlite:")
	if !ok {
		return nil, fmt.Errorf("open sqlite: %q does not start with sqlite:", rawURL)
	}
	path = strings.TrimPrefix(path, "//")
	return Open(path)
}

// DB returns the underlying handle.
func (d *Driver) DB() *sql.DB { return d.db }

// Close closes the handle if Open created it.
func (d *Driver) Close() error {
	if d.owned {
		return d.db.Close()
	}
	return nil
}

// Migrate applies the embedded migrations that have not run yet, in one IMMEDIATE transaction.
func (d *Driver) Migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	commit := false
	defer func() {
		if !commit {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS fenced_schema_migrations (
		version INTEGER NOT NULL PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT`); err != nil {
		return err
	}
	var current int
	if err := conn.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM fenced_schema_migrations`).Scan(&current); err != nil {
		return err
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
		if _, err := conn.ExecContext(ctx, string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", name, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO fenced_schema_migrations (version, applied_at) VALUES (?, `+d.q(nowMicros)+`)`, version); err != nil {
			return err
		}
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	commit = true
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	_, err := d.db.ExecContext(ctx, d.q(sqlProvision), resource)
	return err
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	var gen, until int64
	ok, err := queryOne(ctx, d.db, d.q(sqlAcquire), []any{resource, owner, ttl.Microseconds()}, &gen, &until)
	if err != nil {
		return driver.Grant{}, err
	}
	if !ok {
		// Refused; reading the row only explains why. It is embedded, so this costs microseconds.
		st, err := d.Read(ctx, resource)
		if err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{}, &driver.BusyError{Generation: st.Generation, LeaseUntil: st.LeaseUntil}
	}
	return driver.Grant{Generation: gen, LeaseUntil: fromMicros(until)}, nil
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	var until int64
	ok, err := queryOne(ctx, d.db, d.q(sqlRenew), []any{l.Resource, l.Owner, l.Generation, ttl.Microseconds()}, &until)
	if !ok || err != nil {
		return time.Time{}, false, err
	}
	return fromMicros(until), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, payload []byte) (bool, error) {
	return execOne(ctx, d.db, d.q(sqlPublish), l.Resource, l.Owner, l.Generation, nonNil(payload))
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, payload []byte) (bool, error) {
	return execOne(ctx, d.db, d.q(sqlPublishAndRelease), l.Resource, l.Owner, l.Generation, nonNil(payload))
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return execOne(ctx, d.db, d.q(sqlRelease), l.Resource, l.Owner, l.Generation)
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	var (
		st                 = driver.State{Resource: resource}
		owner              sql.NullString
		until, publishedAt sql.NullInt64
		now                int64
	)
	err := d.db.QueryRowContext(ctx, d.q(sqlRead), resource).Scan(&st.Generation, &owner, &until,
		&st.PublishedGeneration, &publishedAt, &st.PayloadSize, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.State{}, driver.ErrNotFound
	}
	if err != nil {
		return driver.State{}, err
	}
	st.Owner = owner.String
	if until.Valid {
		st.LeaseUntil = fromMicros(until.Int64)
	}
	if publishedAt.Valid {
		st.PublishedAt = fromMicros(publishedAt.Int64)
	}
	st.Now = fromMicros(now)
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	var (
		gen     int64
		payload []byte
	)
	err := d.db.QueryRowContext(ctx, d.q(sqlReadPayload), resource).Scan(&gen, &payload)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, driver.ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	return payload, gen, nil
}

// queryOne runs a statement with RETURNING, reads its result to the end and checks every error
// before trusting the row: ok is true only when exactly one row came back.
func queryOne(ctx context.Context, db *sql.DB, query string, args []any, dest ...any) (bool, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
		if n == 1 {
			if err := rows.Scan(dest...); err != nil {
				return false, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	if err := rows.Close(); err != nil {
		return false, err
	}
	if n > 1 {
		return false, fmt.Errorf("statement matched %d rows; the resource key is not unique", n)
	}
	return n == 1, nil
}

// execOne runs a conditional UPDATE; ok is true when it changed exactly one row.
func execOne(ctx context.Context, db *sql.DB, query string, args ...any) (bool, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n > 1 {
		return false, fmt.Errorf("statement changed %d rows; the resource key is not unique", n)
	}
	return n == 1, nil
}

// nonNil stores an empty payload as an empty blob rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
