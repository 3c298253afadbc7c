// Package sqlserver runs the fenced protocol on Microsoft SQL Server (2017 or later, or Azure
// SQL Database) through database/sql and github.com/microsoft/go-mssqldb.
//
// This backend has not been run against a SQL Server in CI: no SQL Server can be installed
// where the project's CI runs. Its statements' text and parameters are unit-tested without a
// server; the conformance suite and the benchmarks run only when FENCED_TEST_SQLSERVER names
// a server (see sqlserver_test.go).
//
// Every change is one autocommit statement: an UPDATE whose WHERE clause is the protocol's
// condition, judged by SQL Server against SYSUTCDATETIME(). Acquire and Renew return the new
// generation and expiry with OUTPUT in the same round trip (a refused Acquire reads the holder
// in that round trip too, after the UPDATE has decided); Publish, PublishAndRelease and
// Release are accepted when exactly one row was changed. An UPDATE takes an update lock on the
// row before it evaluates the condition, also under READ_COMMITTED_SNAPSHOT, so concurrent
// operations on one resource are evaluated one after another on the latest committed row.
// Each batch first turns NOCOUNT and IMPLICIT_TRANSACTIONS off for itself (see autocommit in
// sql.go), whatever the server or the caller's session set. The table must have no triggers:
// SQL Server refuses OUTPUT without INTO on a table with enabled triggers.
//
// SYSUTCDATETIME() is read when a statement starts. A statement that then waits on a row lock
// judges expiry by that earlier instant: a publication or renewal that waited while its lease
// ran out can still be accepted, as of the moment it started, provided nobody acquired the
// resource in between (an acquisition changes the generation, and the waiting statement sees
// it). Keep the trust window's safety margin larger than the lock waits you expect.
//
// Resource names are NVARCHAR with a binary collation, compared code point by code point;
// owners likewise. SQL Server ignores trailing spaces when it compares NVARCHAR values, so
// "a" and "a " would be one row: the driver refuses resource names that end in a space
// (ErrTrailingSpace) instead of letting two names share a lease.
//
// SQL Server may end a statement as a deadlock victim (error 1205) or, under SNAPSHOT
// isolation, on an update conflict (3960); the statement is then rolled back, so the driver
// runs it again, up to three times in all, and otherwise reports ErrRolledBack.
package sqlserver

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	mssql "github.com/microsoft/go-mssqldb"

	"github.com/fenced-dev/fenced/driver"
)

//go:embed migrations/*.sql
var migrations embed.FS

// ErrRolledBack is matched (errors.Is) by an error from a statement that SQL Server rolled
// back every time it was tried (deadlock victim or update conflict). The operation did not
// happen.
var ErrRolledBack = errors.New("rolled back by SQL Server")

// ErrTrailingSpace is returned for a resource name that ends in a space, which SQL Server
// would not tell apart from the name without it. Nothing was sent to the database.
var ErrTrailingSpace = errors.New("resource names that end in a space are not supported by the SQL Server backend")

const (
	// DefaultSchema is Config.Schema when it is empty.
	DefaultSchema = "dbo"

	// attempts bounds how often a statement that SQL Server rolled back is run.
	attempts = 3

	// migrationLockTimeout is how long Migrate waits for another Migrate to finish.
	migrationLockTimeout = time.Minute
)

// Config configures a driver. A nil *Config means every default.
type Config struct {
	// Schema is the database schema that holds fenced's tables. Default DefaultSchema ("dbo").
	// Migrate creates it when it does not exist. It must be a plain identifier: a letter or
	// underscore, then letters, digits or underscores, at most 128 in all.
	Schema string
}

var schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = DefaultSchema
	}
	if err := out.validate(); err != nil {
		return Config{}, err
	}
	return out, nil
}

func (c Config) validate() error {
	if !schemaName.MatchString(c.Schema) {
		return fmt.Errorf("validate config: schema %q is not a plain identifier", c.Schema)
	}
	return nil
}

// Driver is the SQL Server backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	db     *sql.DB
	owned  bool
	schema string
	sql    statements
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a handle the caller opened (with go-mssqldb) and keeps ownership
// of, with the tables in schema dbo.
func New(db *sql.DB) *Driver {
	d, err := NewWithConfig(db, nil)
	if err != nil {
		panic(err) // unreachable: the defaults are valid
	}
	return d
}

// NewWithConfig is New with a configuration.
func NewWithConfig(db *sql.DB, cfg *Config) (*Driver, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Driver{db: db, schema: c.Schema, sql: newStatements(c.Schema)}, nil
}

// Open connects to sqlserver://user:password@host:port?database=NAME (any go-mssqldb URL
// parameter may follow). An extra parameter schema=NAME sets Config.Schema. The returned driver
// owns the handle and closes it in Close. Open does not connect; the first operation does.
func Open(rawURL string) (*Driver, error) {
	dsn, cfg, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	connector, err := mssql.NewConnector(dsn)
	if err != nil {
		// go-mssqldb's parse errors leave the password out; so does this message.
		return nil, fmt.Errorf("open sqlserver: %w", err)
	}
	d, err := NewWithConfig(sql.OpenDB(connector), &cfg)
	if err != nil {
		return nil, err
	}
	d.owned = true
	return d, nil
}

// parseURL checks the scheme and takes fenced's own parameter out of the URL.
func parseURL(rawURL string) (dsn string, cfg Config, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", Config{}, errors.New("parse sqlserver url: it is not a valid URL") // the error would quote the password
	}
	if u.Scheme != "sqlserver" {
		return "", Config{}, fmt.Errorf("parse sqlserver url: scheme %q is not sqlserver://", u.Scheme)
	}
	if u.Host == "" {
		return "", Config{}, errors.New("parse sqlserver url: no host")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "", Config{}, errors.New("parse sqlserver url: the query is malformed") // the error could quote a password
	}
	if len(q["schema"]) > 1 {
		return "", Config{}, errors.New("parse sqlserver url: schema is given more than once")
	}
	cfg.Schema = q.Get("schema")
	q.Del("schema")
	u.RawQuery = q.Encode()
	if _, err := cfg.withDefaults(); err != nil {
		return "", Config{}, fmt.Errorf("parse sqlserver url: %w", err)
	}
	return u.String(), cfg, nil
}

// DB returns the underlying handle.
func (d *Driver) DB() *sql.DB { return d.db }

// Schema returns the schema that holds the tables.
func (d *Driver) Schema() string { return d.schema }

// Close closes the handle if Open created it.
func (d *Driver) Close() error {
	if d.owned {
		return d.db.Close()
	}
	return nil
}

// Migrate applies the embedded migrations that have not run yet, in one transaction that
// first takes an exclusive application lock (sp_getapplock, owned by the transaction). DDL is
// transactional in SQL Server, so concurrent Migrate calls run one after another, the second
// finding the first's version rows, and a failure leaves no half-applied migration behind.
func (d *Driver) Migrate(ctx context.Context) error {
	return retry(ctx, func() error { return d.migrate(ctx) })
}

func (d *Driver) migrate(ctx context.Context) (err error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return translate("begin migration", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var status int64
	if err := tx.QueryRowContext(ctx, sqlMigrationLock,
		sql.Named("lock", "fenced_migrate:"+d.schema),
		sql.Named("timeout_ms", int32(migrationLockTimeout/time.Millisecond))).Scan(&status); err != nil {
		return translate("take migration lock", err)
	}
	if status < 0 {
		return fmt.Errorf("take migration lock: sp_getapplock returned %d (-1 is a timeout after %s)", status, migrationLockTimeout)
	}
	if _, err := tx.ExecContext(ctx, sqlCreateSchema, sql.Named("schema", d.schema)); err != nil {
		return translate("create schema", err)
	}
	if _, err := tx.ExecContext(ctx, d.sql.createMigrations); err != nil {
		return translate("create migrations table", err)
	}
	var current int64
	if err := tx.QueryRowContext(ctx, d.sql.schemaVersion).Scan(&current); err != nil {
		return translate("read schema version", err)
	}
	for _, name := range names {
		version, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, "migrations/"), "_", 2)[0])
		if err != nil {
			return fmt.Errorf("parse migration %s version: %w", name, err)
		}
		if int64(version) <= current {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return fmt.Errorf("read migration %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, d.sql.names.Replace(string(body))); err != nil {
			return translate("apply migration "+name, err)
		}
		if _, err := tx.ExecContext(ctx, d.sql.recordMigration, sql.Named("version", int32(version))); err != nil {
			return translate("record migration "+name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return translate("commit migration", err)
	}
	return nil
}

// checkResource refuses names SQL Server would not tell apart from another (see package doc).
func checkResource(resource string) error {
	if strings.HasSuffix(resource, " ") {
		return fmt.Errorf("check resource %q: %w", resource, ErrTrailingSpace)
	}
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	if err := checkResource(resource); err != nil {
		return err
	}
	err := retry(ctx, func() error {
		_, err := d.db.ExecContext(ctx, d.sql.provision, resourceArgs(resource)...)
		if duplicateKey(err) {
			return nil // a concurrent Provision inserted the row: it exists, which is all we promise
		}
		return err
	})
	if err != nil {
		return translate("insert resource", err)
	}
	return nil
}

// acquireRow is one row of the acquisition batch: the granted lease (acquired) or the holder.
type acquireRow struct {
	generation int64
	leaseUntil sql.NullTime
	acquired   int64
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	if err := checkResource(resource); err != nil {
		return driver.Grant{}, err
	}
	args, err := acquireArgs(resource, owner, ttl)
	if err != nil {
		return driver.Grant{}, err
	}
	var rows []acquireRow
	err = retry(ctx, func() (err error) {
		rows, err = queryAll(ctx, d.db, d.sql.acquire, args, func(r *sql.Rows) (a acquireRow, err error) {
			return a, r.Scan(&a.generation, &a.leaseUntil, &a.acquired)
		})
		return err
	})
	if err != nil {
		return driver.Grant{}, translate("update lease", err)
	}
	switch {
	case len(rows) == 0:
		return driver.Grant{}, driver.ErrNotFound
	case len(rows) > 1:
		return driver.Grant{}, fmt.Errorf("read acquisition: %d rows came back; the resource key is not unique", len(rows))
	case rows[0].acquired == 1:
		if !rows[0].leaseUntil.Valid {
			return driver.Grant{}, errors.New("read acquisition: the acquisition happened but returned no expiry")
		}
		return driver.Grant{Generation: rows[0].generation, LeaseUntil: rows[0].leaseUntil.Time.UTC()}, nil
	default:
		return driver.Grant{}, &driver.BusyError{Generation: rows[0].generation, LeaseUntil: utc(rows[0].leaseUntil)}
	}
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	if err := checkResource(l.Resource); err != nil {
		return time.Time{}, false, err
	}
	args, err := renewArgs(l, ttl)
	if err != nil {
		return time.Time{}, false, err
	}
	var until []time.Time
	err = retry(ctx, func() (err error) {
		until, err = queryAll(ctx, d.db, d.sql.renew, args, func(r *sql.Rows) (t time.Time, err error) {
			return t, r.Scan(&t)
		})
		return err
	})
	switch {
	case err != nil:
		return time.Time{}, false, translate("update lease expiry", err)
	case len(until) > 1:
		return time.Time{}, false, fmt.Errorf("read renewal: %d rows came back; the resource key is not unique", len(until))
	case len(until) == 0:
		return time.Time{}, false, nil
	}
	return until[0].UTC(), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	return d.execOne(ctx, "update publication", l.Resource, d.sql.publish, publishArgs(l, payload))
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	return d.execOne(ctx, "update publication", l.Resource, d.sql.publishAndRelease, publishArgs(l, payload))
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return d.execOne(ctx, "update lease", l.Resource, d.sql.release, leaseArgs(l))
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	if err := checkResource(resource); err != nil {
		return driver.State{}, err
	}
	var (
		st                 driver.State
		owner              sql.NullString
		until, publishedAt sql.NullTime
		now                time.Time
	)
	err := retry(ctx, func() error {
		return d.db.QueryRowContext(ctx, d.sql.read, resourceArgs(resource)...).Scan(&st.Generation, &owner,
			&until, &st.PublishedGeneration, &publishedAt, &st.PayloadSize, &now)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return driver.State{}, driver.ErrNotFound
	}
	if err != nil {
		return driver.State{}, translate("read resource", err)
	}
	st.Resource = resource
	st.Owner = owner.String
	st.LeaseUntil = utc(until)
	st.PublishedAt = utc(publishedAt)
	st.Now = now.UTC()
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	if err := checkResource(resource); err != nil {
		return nil, 0, err
	}
	var (
		gen     int64
		payload []byte
	)
	err := retry(ctx, func() error {
		return d.db.QueryRowContext(ctx, d.sql.readPayload, resourceArgs(resource)...).Scan(&gen, &payload)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, driver.ErrNotFound
	}
	if err != nil {
		return nil, 0, translate("read payload", err)
	}
	return payload, gen, nil
}

// execOne runs a conditional UPDATE; ok is true when it changed exactly one row. The
// statement begins with SET NOCOUNT OFF (see autocommit), so the count is reported whatever
// the session's setting.
func (d *Driver) execOne(ctx context.Context, what, resource, query string, args []any) (bool, error) {
	if err := checkResource(resource); err != nil {
		return false, err
	}
	var n int64
	err := retry(ctx, func() error {
		res, err := d.db.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, translate(what, err)
	}
	if n > 1 {
		return false, fmt.Errorf("%s: %d rows changed; the resource key is not unique", what, n)
	}
	return n == 1, nil
}

// queryAll runs a statement or batch and reads every row of every result set to the end,
// then checks rows.Err and rows.Close before any row is returned: SQL Server can report an
// error (a deadlock, a rollback) after it has sent OUTPUT rows, and those rows then describe
// a change that did not happen.
func queryAll[T any](ctx context.Context, db *sql.DB, query string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for {
		for rows.Next() {
			v, err := scan(rows)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return out, nil
}

// Error numbers that translate and retry interpret.
const (
	errDeadlockVictim  = 1205 // the statement was rolled back to break a deadlock
	errUpdateConflict  = 3960 // SNAPSHOT isolation: the row changed since the snapshot; rolled back
	errDuplicateKey    = 2627 // PRIMARY KEY or UNIQUE constraint
	errDuplicateKeyIdx = 2601 // unique index
)

// sqlError finds SQL Server's error in err's chain.
func sqlError(err error) (mssql.Error, bool) {
	var e mssql.Error
	if errors.As(err, &e) {
		return e, true
	}
	var p *mssql.Error
	if errors.As(err, &p) && p != nil {
		return *p, true
	}
	return mssql.Error{}, false
}

// rolledBack reports whether SQL Server rolled the statement back, so that it did not happen
// and running it again is safe.
func rolledBack(err error) bool {
	e, ok := sqlError(err)
	return ok && (e.Number == errDeadlockVictim || e.Number == errUpdateConflict)
}

func duplicateKey(err error) bool {
	e, ok := sqlError(err)
	return ok && (e.Number == errDuplicateKey || e.Number == errDuplicateKeyIdx)
}

// translate is the one place that turns a database/sql or go-mssqldb error into the driver's:
// a rollback SQL Server chose matches ErrRolledBack (the operation did not happen); anything
// else is wrapped as it is. A driver error never becomes a refusal or busy.
func translate(what string, err error) error {
	if rolledBack(err) {
		return fmt.Errorf("%s: %w: %w", what, ErrRolledBack, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// retry runs op until it succeeds, fails otherwise than by a rollback SQL Server chose, or has
// been rolled back attempts times. Between attempts it waits a few random milliseconds, so
// that the sessions of a deadlock do not meet again at once.
func retry(ctx context.Context, op func() error) error {
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil || attempt == attempts || !rolledBack(err) {
			return err
		}
		t := time.NewTimer(time.Duration(attempt) * (time.Millisecond + rand.N(5*time.Millisecond)))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func utc(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// TODO(issue 4): the recovery features below are being implemented for this backend; until then
// they fail loudly and the conformance suite's tests for them fail.
var errIssue4Pending = errors.New("sqlserver backend: epochs, operation ids and source versions are not implemented yet")

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
