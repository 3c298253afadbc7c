// Package sqlserver runs the fenced protocol on Microsoft SQL Server (2017 or later, or Azure
// SQL Managed Instance) through database/sql and github.com/microsoft/go-mssqldb, opened with
// the "sqlserver" driver name (sql.Open("sqlserver", ...), mssql.NewConnector, or Open): the
// legacy "mssql" name rewrites the placeholders in query text, which breaks every call, and a
// handle opened with it is refused (ErrLegacyDriver).
//
// This backend has not been run against a SQL Server in CI: no SQL Server can be installed
// where the project's CI runs. Its statements' text and parameters, its error classification
// and the shape of its calls are unit-tested without a server; the conformance suite and the
// benchmarks run only when FENCED_TEST_SQLSERVER names a server (see sqlserver_test.go).
//
// # Procedures
//
// Every operation is one procedure that Migrate installs in the driver's schema (CREATE OR
// ALTER, only where the installed one is missing or differs; see createProcedure), and the
// driver calls it by name. A procedure's parameters have fixed types, so SQL Server keeps one
// plan per operation; a batch sent with sp_executesql would declare NVARCHAR(n) and
// VARBINARY(n) sized to each call's values and compile a plan for nearly every publication.
// Grant lets a role execute the same procedures and nothing else.
//
// # Statements
//
// Every change is one procedure that SQL Server evaluates: a conditional UPDATE whose WHERE
// clause is the protocol's condition, judged against SYSUTCDATETIME(). Acquire and Renew
// return the new token and expiry with OUTPUT in the same round trip (a refused Acquire reads
// the holder in that round trip too, after the UPDATE has decided); Release answers its OUTPUT
// row. Publish and PublishAndRelease run the UPDATE and the record of the operation id as
// accepted in one transaction; ResolveOperation records an unknown id as aborted and reads the
// outcome in one; BumpEpoch advances fenced_meta's epoch and frees every lease in one. Each
// procedure first turns NOCOUNT and IMPLICIT_TRANSACTIONS off for itself, and each that writes
// turns XACT_ABORT on and pins READ COMMITTED (see autocommit and writes in sql.go). The
// tables must have no triggers: SQL Server refuses OUTPUT without INTO on a table with enabled
// triggers.
//
// SYSUTCDATETIME() is read once per statement, when the statement starts, and a statement can
// then wait on a row lock for as long as the holder keeps it. So Acquire, Renew, Publish and
// PublishAndRelease first lock the resource's row (UPDLOCK, ROWLOCK), and a publication then
// its operation id, in the transaction that then runs the conditional UPDATE: that UPDATE
// starts, and reads the clock, once the locks are held, so a renewal never revives a lease
// that expired while it waited and a publication is never accepted after its lease ended.
//
// The operation id's key-range lock (UPDLOCK, HOLDLOCK on an id that has no row yet) also
// covers the neighbouring ids in the index, so publications whose ids fall into one gap of
// fenced_operations wait for each other: on an empty table, all publications of the whole
// store run one after another for the few statements that follow. How much this costs under
// load has not been measured (no server here); BenchmarkProtocol measures it once one is.
//
// # Incarnation
//
// fenced_meta records the database's incarnation (recovery_fork_guid and database_guid from
// sys.database_recovery_status) when Migrate creates the store and at every BumpEpoch.
// Acquire, Renew, Publish, PublishAndRelease and Release compare it with the database's
// before they lock anything and fail with driver.ErrIncarnationChanged (error 51801) until
// BumpEpoch records the new one: after a restore as a new database, or one recovered at a
// point other than the end of its log, no lease issued in the lost history can be used and
// none is issued under the old epoch. Not detected: a restore that is rolled forward through
// every log backup to the end of the log (nothing acknowledged is lost), and files copied and
// attached in place of the database (same database_guid). Availability groups: the
// documentation does not say whether a failover changes either GUID, and this was not tried on
// a server. If it does not, a forced failover that lost acknowledged commits goes unnoticed;
// if it does (a secondary is seeded by a restore, which may give it a database_guid of its
// own), every failover, planned or not, stops lease operations until BumpEpoch. Either way,
// bump the epoch after a forced failover. Reading the row needs the
// database's ownership or VIEW ANY DATABASE (granted to public by default); a login without
// it gets error 51802 naming the permission, also as a granted role, since ownership chaining
// does not extend to catalog views.
//
// # Outcomes
//
// A call runs on a connection the driver holds for it, so database/sql never sends it again on
// another connection, and the driver discards that connection after any error: a compile
// error (208, 207 after a schema change) is not covered by XACT_ABORT and leaves the
// procedure's transaction open, with its row locks held, on the connection; closing it makes
// SQL Server roll that transaction back. An error is reported as driver.ErrNotApplied only
// when the call provably did not take effect - no connection could be had, go-mssqldb or
// database/sql failed before anything was written, or SQL Server answered with an error that
// has a number and a severity from 11 to 19 (XACT_ABORT rolled the transaction back, or the
// discarded connection's open transaction is rolled back); see notApplied. A connection lost
// while reading the reply is an unknown outcome, and so is an error without a number, which
// go-mssqldb synthesizes when the server flagged an error and sent none.
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
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	mssql "github.com/microsoft/go-mssqldb"
	"github.com/microsoft/go-mssqldb/msdsn"

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

// ErrLegacyDriver is returned for a handle opened with go-mssqldb's deprecated "mssql" driver
// name, which rewrites "?" and "$n" in query text into parameters and then fails every call
// that passes named ones ("sql: expected 0 arguments") before anything is sent. Open the
// handle with sql.Open("sqlserver", ...) or mssql.NewConnector instead.
var ErrLegacyDriver = errors.New(`the SQL Server backend needs a handle opened with the "sqlserver" driver name, not the legacy "mssql"`)

// legacyDriver is the driver instance behind the "mssql" name (and behind
// NewConnectorWithProcessQueryText, which does the same rewriting), for comparison with a
// handle's: go-mssqldb registers two instances of one type, told apart only by identity.
var legacyDriver = mssql.NewConnectorWithProcessQueryText(msdsn.Config{}).Driver()

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
	db      *sql.DB
	owned   bool
	schema  string
	sql     statements
	refused error // why this handle cannot be used (New cannot return it); nil when it can
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a handle the caller opened with go-mssqldb's "sqlserver" driver
// name and keeps ownership of, with the tables in schema dbo. Over a handle opened with the
// legacy "mssql" name, every method returns ErrLegacyDriver and sends nothing;
// NewWithConfig returns that error at once.
func New(db *sql.DB) *Driver {
	d, err := NewWithConfig(db, nil)
	if err != nil {
		return &Driver{db: db, schema: DefaultSchema, sql: newStatements(DefaultSchema), refused: err}
	}
	return d
}

// NewWithConfig is New with a configuration.
func NewWithConfig(db *sql.DB, cfg *Config) (*Driver, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if db != nil && db.Driver() == legacyDriver {
		return nil, fmt.Errorf("new sqlserver driver: %w", ErrLegacyDriver)
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
	addr := "the host of the URL"
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		addr = u.Host
	}
	d, err := NewWithConfig(sql.OpenDB(connectErrors{connector, addr}), &cfg)
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

// Migrate applies the embedded migrations that have not run yet and installs the procedures
// that are missing or differ from this version's, in one transaction that first takes an
// exclusive application lock (sp_getapplock, owned by the transaction). DDL is transactional
// in SQL Server, so concurrent Migrate calls run one after another, the second finding the
// first's version rows and procedures, and a failure leaves nothing half-applied behind. When
// it applied a migration, it records the database's incarnation if none is recorded yet (see
// tmplRecordIncarnation). A login that may not alter the schema (a role Grant set up) can run
// it once the owner has run this version's Migrate: it then finds nothing to do.
func (d *Driver) Migrate(ctx context.Context) error {
	if d.refused != nil {
		return d.refused
	}
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
	applied := false
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
		applied = true
	}
	if applied {
		if _, err := tx.ExecContext(ctx, d.sql.recordIncarnation); err != nil {
			return translate("record incarnation", err)
		}
	}
	if err := d.installProcedures(ctx, tx); err != nil {
		return err
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

// BumpEpoch advances the epoch to max(epoch + 1, the engine's clock in microseconds), records
// the database's current incarnation and frees every lease, in one transaction (see
// tmplBumpEpoch).
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	epochs, err := mutate(ctx, d, "bump epoch", opBumpEpoch, nil, func(r *sql.Rows) (e sql.NullInt64, err error) {
		return e, r.Scan(&e)
	})
	switch {
	case err != nil:
		return 0, err
	case len(epochs) != 1 || !epochs[0].Valid:
		return 0, errors.New("fenced_meta has no epoch row; run Migrate")
	}
	return epochs[0].Int64, nil
}

// PruneOperations deletes the records older than age in batches (see tmplPrune). An error
// may follow deleted batches, so it is never reported as not applied.
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
	if d.refused != nil {
		return nil, d.refused
	}
	var setting string
	if err := d.db.QueryRowContext(ctx, sqlDurability).Scan(&setting); err != nil {
		return nil, fmt.Errorf("read delayed durability: %w", err)
	}
	if strings.EqualFold(setting, "DISABLED") {
		return nil, nil
	}
	return []string{fmt.Sprintf("SQL Server DELAYED_DURABILITY is %s, not DISABLED: a crash can lose commits that were acknowledged", setting)}, nil
}

// installProcedures creates or alters, in tx, the procedures that are missing or lack this
// version's fingerprint (see createProcedure). CREATE PROCEDURE must be the first statement
// of its batch: one batch each.
func (d *Driver) installProcedures(ctx context.Context, tx *sql.Tx) error {
	stale, err := queryAll(ctx, tx, d.sql.staleProcedures, nil, scanInt)
	if err != nil {
		return translate("find procedures to install", err)
	}
	for _, o := range stale {
		if o < 0 || o >= int64(numOps) {
			return fmt.Errorf("find procedures to install: unknown operation %d", o)
		}
		if _, err := tx.ExecContext(ctx, d.sql.create[o]); err != nil {
			return translate("create procedure "+routines[o].procedure, err)
		}
	}
	return nil
}

// mutate calls one operation's procedure on a connection of its own and reads its whole
// reply. Holding the connection ourselves keeps database/sql from running the call again on
// another connection after a connection error (its retry on driver.ErrBadConn), tells the
// errors of getting a connection (nothing was sent) from those of the request, and lets us
// discard the connection after an error (see discard). Every error is classified by
// translate, a prune's by translatePartial. Reads go through it too, for the same reading of
// the reply; their classification does not matter.
func mutate[T any](ctx context.Context, d *Driver, what string, o op, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if d.refused != nil {
		return nil, driver.NotApplied(fmt.Errorf("%s: %w", what, d.refused))
	}
	var out []T
	err := retry(ctx, func() error {
		conn, err := d.db.Conn(ctx)
		if err != nil {
			if connFailure(err) {
				return driver.NotApplied(err) // its text names the server
			}
			return driver.NotApplied(fmt.Errorf("get connection: %w", err))
		}
		defer conn.Close()
		out, err = queryAll(ctx, conn, d.sql.procedure[o], args, scan)
		if err != nil {
			discard(conn)
		}
		return err
	})
	switch {
	case err == nil:
		return out, nil
	case isPermissionDenied(err):
		return nil, d.denied(ctx, o, args, err)
	case o == opPrune:
		return nil, translatePartial(what, err)
	}
	return nil, translate(what, err)
}

// errPermissionDenied is SQL Server's refusal to execute a procedure the principal was not
// granted (229, "The EXECUTE permission was denied on the object").
const errPermissionDenied = 229

// isPermissionDenied reports a refusal for lack of rights: a procedure the role was not
// granted (229) or a resource outside its prefixes (errOutsidePrefixes, prefixCheck's THROW).
func isPermissionDenied(err error) bool {
	e, ok := sqlError(err)
	return ok && (e.Number == errPermissionDenied || e.Number == errOutsidePrefixes)
}

// opWords names each operation in a refusal for lack of rights.
var opWords = [numOps]string{
	opProvision: "provision", opAcquire: "acquire", opRenew: "renew", opPublish: "publish",
	opPublishAndRelease: "publish", opRelease: "release", opRead: "read", opReadPayload: "read",
	opResolve: "resolve an operation", opReadOperation: "read an operation", opBumpEpoch: "bump the epoch",
	opPrune: "prune operation records",
}

// denied is the refusal of o to the database user this driver logs in as, which it reads with
// one more query (on this error only). The refusal came before the procedure changed
// anything: 229 before it ran, 51803 before its first read of a table. For a prefix refusal
// the resource is taken from the call's arguments.
func (d *Driver) denied(ctx context.Context, o op, args []any, err error) error {
	pe := &driver.PermissionError{Role: "(unknown)", Operation: opWords[o], Err: err}
	if e, ok := sqlError(err); ok && e.Number == errOutsidePrefixes {
		pe.Resource = namedString(args, "resource")
	}
	var user sql.NullString
	if qerr := d.db.QueryRowContext(ctx, `SELECT USER_NAME()`).Scan(&user); qerr == nil && user.Valid {
		pe.Role = user.String
	}
	return pe
}

// discard closes conn's physical connection instead of returning it to the pool. XACT_ABORT
// does not cover compile errors - a table or column missing when a statement is (re)compiled
// (208, 207): the procedure stops with its transaction open and its locks held (https://learn.microsoft.com/sql/t-sql/statements/set-xact-abort-transact-sql).
// A pooled connection would keep them until it was next used, and its next call would run
// inside that transaction. Closing the connection makes SQL Server roll the transaction back.
// database/sql closes a connection whose Raw function returns driver.ErrBadConn (Conn.Raw
// releases it with that error, and the pool drops a connection released so).
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return sqldriver.ErrBadConn })
}

// namedString is the value of the string argument called name among args ("" if none).
func namedString(args []any, name string) string {
	for _, a := range args {
		if n, ok := a.(sql.NamedArg); ok && n.Name == name {
			v, _ := n.Value.(string)
			return v
		}
	}
	return ""
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
// It marks the error driver.ErrNotApplied only when the call certainly did not take effect
// (see notApplied); a rollback SQL Server chose also matches ErrRolledBack, and the
// incarnation check's error matches driver.ErrIncarnationChanged. Anything else may have
// happened and stays a plain error, which the core reports as an unknown outcome. A driver
// error never becomes a refusal or busy.
func translate(what string, err error) error {
	if connFailure(err) { // which statement is beside the point; none was sent
		return driver.NotApplied(err)
	}
	wrapped := fmt.Errorf("%s: %w", what, err)
	if rolledBack(err) {
		wrapped = fmt.Errorf("%s: %w: %w", what, ErrRolledBack, err)
	}
	if e, ok := sqlError(err); ok && e.Number == errIncarnationChanged {
		wrapped = fmt.Errorf("%s: %w: %w", what, driver.ErrIncarnationChanged, err)
	}
	if notApplied(err) {
		return driver.NotApplied(wrapped)
	}
	return wrapped
}

// translatePartial is translate for a call that commits as it goes (PruneOperations): an
// error never says that nothing happened, only a failure to get a connection does.
func translatePartial(what string, err error) error {
	if errors.Is(err, driver.ErrNotApplied) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: some records may have been deleted: %w", what, err)
}

// notApplied reports whether err proves that the call did not take effect:
//   - it was marked so where that was known: no connection could be had (dial, login, a
//     context ended before anything was sent);
//   - database/sql refused the arguments before handing anything to go-mssqldb (argumentError);
//   - driver.ErrBadConn: go-mssqldb returns it, bare, only from the connectionGood check
//     before it writes anything (mssql.go, Stmt.queryContext and Conn.BeginTx in v1.11.2), and
//     as RetryableError only when writing the request failed (sendQuery's error passed to
//     checkBadConn with mayRetry): SQL Server runs a request only once its last packet has
//     arrived whole, and the write of that packet is what failed;
//   - a SQL Server error (mssql.Error) that the server reported with a number, every one of
//     its errors numbered and of severity 11 to 19: every writing procedure runs with
//     XACT_ABORT ON and keeps its work inside one transaction (or is one statement), so a
//     run-time error rolled that work back, and a compile error left the transaction open on a
//     connection that mutate then discards, which rolls it back. Severity 20 and above (and
//     go-mssqldb's ServerError, DONE_SRVERROR) are fatal errors that end the connection,
//     possibly around a commit: unknown. So is an error numbered 0: go-mssqldb makes one up
//     ("Request failed but didn't provide reason", token.go doneStruct.getError) when the
//     server flagged an error in its DONE token without sending the error itself, and then
//     nothing says what happened.
//
// A lost connection while reading the reply (io.EOF, *net.OpError, StreamError) or a context
// that ended after sending is unknown.
func notApplied(err error) bool {
	if errors.Is(err, driver.ErrNotApplied) || argumentError(err) {
		return true
	}
	var fatal mssql.ServerError
	if errors.As(err, &fatal) {
		return false
	}
	if e, ok := sqlError(err); ok {
		return numbered(e) && maxClass(e) >= 11 && maxClass(e) < 20
	}
	return errors.Is(err, sqldriver.ErrBadConn)
}

// argumentError reports database/sql's own refusal of a call's arguments, which it makes
// before the driver sees the call (database/sql convert.go, driverArgsConnLocked: "sql:
// expected %d arguments, got %d" and "sql: converting argument %s type: %w"). database/sql
// exports no type for them, so they are recognised by their text, at the head of the chain
// where database/sql puts them.
func argumentError(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if m := err.Error(); strings.HasPrefix(m, "sql: expected ") && strings.Contains(m, " arguments, got ") ||
			strings.HasPrefix(m, "sql: converting argument ") {
			return true
		}
	}
	return false
}

// numbered reports whether e and every error reported with it carry an error number.
func numbered(e mssql.Error) bool {
	if e.Number <= 0 {
		return false
	}
	for _, a := range e.All {
		if a.Number <= 0 {
			return false
		}
	}
	return true
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

// connectErrors words every failure of go-mssqldb's connector to make a connection (the dial,
// TLS, the login) as a connectError. Driver() is the connector's own, so the handle is still
// recognised as the sqlserver driver's.
type connectErrors struct {
	*mssql.Connector
	addr string // host[:port] as the URL gives it
}

func (c connectErrors) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil && ctx.Err() == nil {
		return nil, &connectError{addr: c.addr, err: err}
	}
	return conn, err
}

// connectError says which server could not be reached and why, the cause last; the
// connector's error stays reachable with errors.As.
type connectError struct {
	addr string
	err  error
}

func (e *connectError) Error() string {
	var (
		dns   *net.DNSError
		errno syscall.Errno
		cause = e.err.Error()
	)
	if se, ok := sqlError(e.err); ok { // refused by the server: a login failed, no such database
		cause = se.Message
	} else if errors.As(e.err, &dns) {
		cause = dns.Error()
	} else if errors.As(e.err, &errno) {
		cause = errno.Error()
	}
	return fmt.Sprintf("cannot connect to the SQL Server at %s: %s", e.addr, cause)
}

func (e *connectError) Unwrap() error { return e.err }

// connFailure reports whether err is connectErrors' failure to make a connection.
func connFailure(err error) bool {
	var ce *connectError
	return errors.As(err, &ce)
}
