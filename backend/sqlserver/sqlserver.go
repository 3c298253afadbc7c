// Package sqlserver runs the fenced protocol on Microsoft SQL Server (2017 or later, or Azure
// SQL Database) through database/sql and github.com/microsoft/go-mssqldb.
//
// This backend has not been run against a SQL Server in CI: no SQL Server can be installed
// where the project's CI runs. Its statements' text and parameters are unit-tested without a
// server; the conformance suite and the benchmarks run only when FENCED_TEST_SQLSERVER names
// a server (see sqlserver_test.go).
//
// Every change is one batch that SQL Server evaluates: a conditional UPDATE whose WHERE clause
// is the protocol's condition, judged against SYSUTCDATETIME(). Acquire and Renew return the
// new token and expiry with OUTPUT in the same round trip (a refused Acquire reads the holder
// in that round trip too, after the UPDATE has decided); Release answers its OUTPUT row.
// Publish and PublishAndRelease run the UPDATE and the record of the operation id as accepted
// in one transaction inside the batch; ResolveOperation records an unknown id as aborted and
// reads the outcome in one; BumpEpoch advances fenced_meta's epoch and frees every lease in
// one. An UPDATE takes an update lock on the row before it evaluates the condition, also
// under READ_COMMITTED_SNAPSHOT, so concurrent operations on one resource are evaluated one
// after another on the latest committed row. Each batch first turns NOCOUNT and
// IMPLICIT_TRANSACTIONS off for itself, and each that writes turns XACT_ABORT on and pins READ
// COMMITTED (see autocommit and writes in sql.go). The tables must have no triggers: SQL
// Server refuses OUTPUT without INTO on a table with enabled triggers.
//
// Outcomes: a writing batch runs on a connection the driver holds for it, so database/sql
// never sends it again on another connection. An error is reported as driver.ErrNotApplied
// only when the batch provably did not take effect - no connection could be had, go-mssqldb
// failed before or while writing the request, or SQL Server answered with an error below
// severity 20 (XACT_ABORT rolled the batch's transaction back); see notApplied. A connection
// lost while reading the reply is an unknown outcome.
//
// Grant installs the operations as procedures, their bodies the driver's own statements, and
// limits a role to executing them; a driver connected as that role finds this out by itself
// and calls the procedures (see Grant and Driver.statement).
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
	sqldriver "database/sql/driver"
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
	"sync/atomic"
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
	mode   atomic.Int32 // modeUnknown until detect has an answer
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
//
// It then asks once whether this login writes the tables or calls Grant's procedures (see
// statement), so that the store's first operation does not have to.
func (d *Driver) Migrate(ctx context.Context) error {
	if err := retry(ctx, func() error { return d.migrate(ctx) }); err != nil {
		return err
	}
	d.detect(ctx)
	return nil
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
	_, err := mutate(ctx, d, "insert resource", opProvision, resourceArgs(resource), scanNothing)
	if duplicateKey(err) {
		return nil // a concurrent Provision inserted the row: it exists, which is all we promise
	}
	return err
}

// acquireRow is one row of the acquisition batch: the granted lease (acquired) or the holder.
type acquireRow struct {
	epoch, generation int64
	leaseUntil        sql.NullTime
	acquired          int64
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	if err := checkResource(resource); err != nil {
		return driver.Grant{}, err
	}
	args, err := acquireArgs(resource, owner, ttl)
	if err != nil {
		return driver.Grant{}, err
	}
	rows, err := mutate(ctx, d, "update lease", opAcquire, args, func(r *sql.Rows) (a acquireRow, err error) {
		return a, r.Scan(&a.epoch, &a.generation, &a.leaseUntil, &a.acquired)
	})
	switch {
	case err != nil:
		return driver.Grant{}, err
	case len(rows) == 0:
		return driver.Grant{}, driver.ErrNotFound
	case len(rows) > 1:
		return driver.Grant{}, fmt.Errorf("read acquisition: %d rows came back; the resource key is not unique", len(rows))
	case rows[0].acquired == 1:
		if !rows[0].leaseUntil.Valid {
			return driver.Grant{}, errors.New("read acquisition: the acquisition happened but returned no expiry")
		}
		return driver.Grant{Epoch: rows[0].epoch, Generation: rows[0].generation, LeaseUntil: rows[0].leaseUntil.Time.UTC()}, nil
	default:
		return driver.Grant{}, &driver.BusyError{Epoch: rows[0].epoch, Generation: rows[0].generation, LeaseUntil: utc(rows[0].leaseUntil)}
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
	until, err := mutate(ctx, d, "update lease expiry", opRenew, args, func(r *sql.Rows) (t time.Time, err error) {
		return t, r.Scan(&t)
	})
	switch {
	case err != nil:
		return time.Time{}, false, err
	case len(until) > 1:
		return time.Time{}, false, fmt.Errorf("read renewal: %d rows came back; the resource key is not unique", len(until))
	case len(until) == 0:
		return time.Time{}, false, nil
	}
	return until[0].UTC(), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, opPublish, l, pub)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, opPublishAndRelease, l, pub)
}

// publish runs the conditional publication and the record of its operation id in one
// transaction (see tmplPublish). A duplicate key on the operation id means another
// publication or a Resolve recorded it between our check and our insert (which the range lock
// should prevent); XACT_ABORT rolled the whole transaction back, so it is a refusal.
func (d *Driver) publish(ctx context.Context, o op, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	if err := checkResource(l.Resource); err != nil {
		return false, err
	}
	n, err := mutate(ctx, d, "update publication", o, publishArgs(l, pub), scanInt)
	if duplicateKey(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return exactlyOne("update publication", n)
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	if err := checkResource(l.Resource); err != nil {
		return false, err
	}
	rows, err := mutate(ctx, d, "update lease", opRelease, leaseArgs(l), scanInt)
	if err != nil {
		return false, err
	}
	if len(rows) > 1 {
		return false, fmt.Errorf("update lease: %d rows changed; the resource key is not unique", len(rows))
	}
	return len(rows) == 1, nil
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	if err := checkResource(resource); err != nil {
		return driver.State{}, err
	}
	var (
		st                 driver.State
		owner              sql.NullString
		until, publishedAt sql.NullTime
		currentEpoch       sql.NullInt64
		now                time.Time
	)
	rows, err := mutate(ctx, d, "read resource", opRead, resourceArgs(resource), func(r *sql.Rows) (struct{}, error) {
		return struct{}{}, r.Scan(&st.Epoch, &st.Generation, &owner, &until, &st.PublishedEpoch,
			&st.PublishedGeneration, &publishedAt, &st.SourceVersion, &st.PayloadSize, &currentEpoch, &now)
	})
	switch {
	case err != nil:
		return driver.State{}, err
	case len(rows) == 0:
		return driver.State{}, driver.ErrNotFound
	case len(rows) > 1:
		return driver.State{}, fmt.Errorf("read resource: %d rows came back; the resource key is not unique", len(rows))
	}
	st.Resource = resource
	st.Owner = owner.String
	st.LeaseUntil = utc(until)
	st.PublishedAt = utc(publishedAt)
	st.CurrentEpoch = currentEpoch.Int64
	st.Now = now.UTC()
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	if err := checkResource(resource); err != nil {
		return nil, 0, err
	}
	type published struct {
		generation int64
		payload    []byte
	}
	rows, err := mutate(ctx, d, "read payload", opReadPayload, resourceArgs(resource), func(r *sql.Rows) (p published, err error) {
		return p, r.Scan(&p.generation, &p.payload)
	})
	switch {
	case err != nil:
		return nil, 0, err
	case len(rows) == 0:
		return nil, 0, driver.ErrNotFound
	}
	return rows[0].payload, rows[0].generation, nil
}

func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	return d.operation(ctx, "resolve operation", opResolve, opID)
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	return d.operation(ctx, "read operation", opReadOperation, opID)
}

func (d *Driver) operation(ctx context.Context, what string, o op, opID string) (driver.Operation, error) {
	rows, err := mutate(ctx, d, what, o, opArgs(opID), func(r *sql.Rows) (driver.Operation, error) {
		var (
			op                driver.Operation
			resource          sql.NullString
			epoch, generation sql.NullInt64
			at                sql.NullTime
		)
		err := r.Scan(&op.Outcome, &resource, &epoch, &generation, &at)
		op.Resource, op.Epoch, op.Generation, op.RecordedAt = resource.String, epoch.Int64, generation.Int64, utc(at)
		return op, err
	})
	switch {
	case err != nil:
		return driver.Operation{}, err
	case len(rows) == 0:
		if o == opResolve {
			return driver.Operation{}, fmt.Errorf("%s: no outcome came back for %q", what, opID)
		}
		return driver.Operation{OpID: opID}, nil
	}
	rows[0].OpID = opID
	return rows[0], nil
}

// BumpEpoch advances the epoch and frees every lease in one transaction (see tmplBumpEpoch).
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	epochs, err := mutate(ctx, d, "bump epoch", opBumpEpoch, nil, func(r *sql.Rows) (e sql.NullInt64, err error) {
		return e, r.Scan(&e)
	})
	switch {
	case err != nil:
		return 0, err
	case len(epochs) != 1 || !epochs[0].Valid:
		return 0, errors.New("bump epoch: fenced_meta has no epoch row; run Migrate")
	}
	return epochs[0].Int64, nil
}

func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	args, err := pruneArgs(age)
	if err != nil {
		return 0, err
	}
	n, err := mutate(ctx, d, "delete operations", opPrune, args, scanInt)
	if err != nil {
		return 0, err
	}
	if len(n) != 1 {
		return 0, fmt.Errorf("delete operations: %d counts came back", len(n))
	}
	return n[0], nil
}

var _ driver.DurabilityChecker = (*Driver)(nil)

// CheckDurability warns when the database lets commits be acknowledged before their log
// records are on disk (DELAYED_DURABILITY other than DISABLED). Under FORCED every commit is
// delayed; under ALLOWED only transactions that ask for it, which fenced's never do, but
// other code in the database may, and a crash then loses the log tail its commits share.
// When the setting cannot be read it returns the error; the store decides what not knowing
// means (only a strict store refuses to open).
func (d *Driver) CheckDurability(ctx context.Context) ([]string, error) {
	var setting string
	if err := d.db.QueryRowContext(ctx, sqlDurability).Scan(&setting); err != nil {
		return nil, fmt.Errorf("read delayed durability: %w", err)
	}
	if strings.EqualFold(setting, "DISABLED") {
		return nil, nil
	}
	return []string{fmt.Sprintf("SQL Server DELAYED_DURABILITY is %s, not DISABLED: a crash can lose commits that were acknowledged", setting)}, nil
}

// Modes of a driver: whether it sends its statements or calls the procedures Grant installed.
const (
	modeUnknown int32 = iota
	modeDirect
	modeProcedures
)

// statement returns what to send for o: the batch itself, or the name of its procedure when
// this login may not update fenced's tables and the procedures are installed, which is how
// a login that Grant set up finds itself. Nothing needs configuring: the first operation (or
// Migrate) asks the server once; the answer is kept when it is conclusive.
func (d *Driver) statement(ctx context.Context, o op) (string, error) {
	if d.detect(ctx) == modeProcedures {
		return d.sql.procedure[o], nil
	}
	return d.sql.text[o], nil
}

// detect decides the mode. When the privileges cannot be read it answers direct without
// keeping it: the statement itself then fails and says why.
func (d *Driver) detect(ctx context.Context) int32 {
	if m := d.mode.Load(); m != modeUnknown {
		return m
	}
	var canUpdate, procedure sql.NullInt64
	err := d.db.QueryRowContext(ctx, sqlPrivileges, sql.Named("table", d.sql.resourcesTable),
		sql.Named("procedure", d.sql.acquireProcedure)).Scan(&canUpdate, &procedure)
	switch {
	case err != nil:
		return modeDirect
	case canUpdate.Valid && canUpdate.Int64 == 1:
		d.mode.Store(modeDirect)
	case procedure.Valid:
		d.mode.Store(modeProcedures)
	default: // neither: not migrated yet, or not granted yet
		return modeDirect
	}
	return d.mode.Load()
}

// mutate runs one operation's batch or procedure on a connection of its own and reads its
// whole reply. Holding the connection ourselves keeps database/sql from running the batch
// again on another connection after a connection error (its retry on driver.ErrBadConn), and
// tells the errors of getting a connection (nothing was sent) from those of the request.
// Every error is classified by translate. Reads go through it too, for the same reading of
// the reply; their classification does not matter.
func mutate[T any](ctx context.Context, d *Driver, what string, o op, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	var out []T
	err := retry(ctx, func() error {
		query, err := d.statement(ctx, o)
		if err != nil {
			return err
		}
		conn, err := d.db.Conn(ctx)
		if err != nil {
			return driver.NotApplied(fmt.Errorf("get connection: %w", err))
		}
		defer conn.Close()
		out, err = queryAll(ctx, conn, query, args, scan)
		return err
	})
	if err != nil {
		return nil, translate(what, err)
	}
	return out, nil
}

func scanNothing(*sql.Rows) (struct{}, error) { return struct{}{}, nil }

func scanInt(r *sql.Rows) (n int64, err error) { return n, r.Scan(&n) }

// exactlyOne reads a batch's single count: 1 is accepted, 0 refused.
func exactlyOne(what string, n []int64) (bool, error) {
	switch {
	case len(n) != 1:
		return false, fmt.Errorf("%s: %d counts came back, want 1", what, len(n))
	case n[0] > 1:
		return false, fmt.Errorf("%s: %d rows changed; the resource key is not unique", what, n[0])
	}
	return n[0] == 1, nil
}

// queryAll runs a statement or batch and reads every row of every result set to the end,
// then checks rows.Err and rows.Close before any row is returned: SQL Server can report an
// error (a deadlock, a rollback) after it has sent OUTPUT rows, and those rows then describe
// a change that did not happen.
func queryAll[T any](ctx context.Context, db queryer, query string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
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

// queryer is a *sql.DB or *sql.Conn.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
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

// translate is the one place that turns a database/sql or go-mssqldb error into the driver's.
// It marks the error driver.ErrNotApplied only when the batch certainly did not take effect
// (see notApplied); a rollback SQL Server chose also matches ErrRolledBack. Anything else may
// have happened and stays a plain error, which the core reports as an unknown outcome. A
// driver error never becomes a refusal or busy.
func translate(what string, err error) error {
	wrapped := fmt.Errorf("%s: %w", what, err)
	if rolledBack(err) {
		wrapped = fmt.Errorf("%s: %w: %w", what, ErrRolledBack, err)
	}
	if notApplied(err) {
		return driver.NotApplied(wrapped)
	}
	return wrapped
}

// notApplied reports whether err proves that the batch did not take effect:
//   - it was marked so where that was known: no connection could be had (dial, login, a
//     context ended before anything was sent);
//   - driver.ErrBadConn: go-mssqldb returns it, bare, only from the connectionGood check
//     before it writes anything (mssql.go, Stmt.queryContext and Conn.BeginTx in v1.11.2), and
//     as RetryableError only when writing the request failed (sendQuery's error passed to
//     checkBadConn with mayRetry): SQL Server runs a request only once its last packet has
//     arrived whole, and the write of that packet is what failed;
//   - a SQL Server error (mssql.Error) of severity below 20: every writing batch runs with
//     XACT_ABORT ON and keeps its work inside one transaction (or is one autocommit
//     statement), so an error reply means that work was rolled back. Severity 20 and above
//     (and go-mssqldb's ServerError, DONE_SRVERROR) are fatal errors that end the connection,
//     possibly around a commit: unknown.
//
// A lost connection while reading the reply (io.EOF, *net.OpError, StreamError) or a context
// that ended after sending is unknown.
func notApplied(err error) bool {
	if errors.Is(err, driver.ErrNotApplied) {
		return true
	}
	var fatal mssql.ServerError
	if errors.As(err, &fatal) {
		return false
	}
	if e, ok := sqlError(err); ok {
		return maxClass(e) < 20
	}
	return errors.Is(err, sqldriver.ErrBadConn)
}

// maxClass is the highest severity among the errors the server reported with e.
func maxClass(e mssql.Error) uint8 {
	c := e.Class
	for _, a := range e.All {
		c = max(c, a.Class)
	}
	return c
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
