// Package postgres runs the fenced protocol on PostgreSQL through pgx.
//
// # Statements and routines
//
// Every operation is decided by one statement (sql.go; a renewal or a publication first locks
// the row, see below), also installed by Migrate as a PL/pgSQL function whose body is that
// statement (after the lock): fenced_acquire, fenced_publish, fenced_resolve and so on. The
// functions are SECURITY DEFINER, owned by the user that migrated, with the search path fixed
// to the schema they were created in (and pg_temp last), and their EXECUTE right is revoked
// from PUBLIC. Grant then takes every right on the tables away from PUBLIC and from a role and
// gives that role only the functions: code connected as the role cannot write the tables
// without the fence, and a store connected as the role works unchanged.
//
// A driver whose user may update fenced_resources (the owner, typically) sends the statements
// themselves; one that may not, but may call fenced_read, calls the functions. The driver
// asks the server once, on its first operation, and keeps the answer when it is conclusive
// (before Migrate there is nothing to ask about; the statements are sent and fail). The
// function call costs 15–50% over the bare statement (docs/BENCHMARKS.md), which the owner
// has no reason to pay. Statement text is never copied: a function's body is built from the
// same constants, Migrate replaces a function whose body differs from the code's, and the
// conformance suite runs both ways (as the owner, and as a granted role at every isolation
// level).
//
// Expiry is judged by the server's clock_timestamp(), never by now(), which is frozen at the
// start of a transaction; a renewal or a publication first locks the row, in the same
// transaction (a batch of two statements, or two statements in the function), so that it reads
// the clock after any wait for another session's lock (see sql.go). Tables and functions are not schema-qualified in calls,
// so the connection's search_path chooses the schema.
//
// # Isolation levels
//
// The statements are correct at every isolation level. Under REPEATABLE READ and SERIALIZABLE
// (for instance as default_transaction_isolation), a statement that meets a concurrent update
// fails with a serialization failure instead of waiting and re-checking; since each call is its
// own transaction, such a failure means it was rolled back, and the driver runs it again a
// bounded number of times, so the losers of a race still see "busy" rather than an error.
//
// # Outcomes
//
// An error is reported as not applied (driver.ErrNotApplied) only when the call certainly had
// no effect: no connection could be had or made, pgx reports that nothing was sent
// (pgconn.SafeToRetry), or the server answered with an ERROR, which rolls the autocommit
// transaction back. Anything else after sending (a broken connection, a timeout, a FATAL
// message) leaves the outcome unknown. Neither pgx nor pgxpool sends a statement again on its
// own; the driver repeats a call only after the server reported a serialization failure or a
// deadlock. Calls are prepared once per connection and then executed by name
// (pgx.QueryExecModeCacheStatement): the execution is one Bind/Execute/Sync exchange. A
// connection lost while a call is being prepared is reported as unknown too, although the
// preparation itself changes nothing: the driver cannot tell the two exchanges apart after the
// fact, and unknown is the safe answer.
//
// # Incarnation
//
// fenced_meta records the server's system identifier and timeline when the schema is created
// and at every BumpEpoch. Each lease-carrying statement compares them with the server's
// (read from the server on every call, never cached in the session) and fails with driver.ErrIncarnationChanged until BumpEpoch
// records the new incarnation: after a restore that changed the system identifier or a
// promotion or point-in-time recovery that started a new timeline, no lease issued in the lost
// history can be used, and no new one is issued under the old epoch. A restore of a file-level
// copy of the same cluster onto the same timeline, or of a logical dump into the same cluster,
// changes neither value and is not detected: run BumpEpoch after those by hand.
//
// The check is inside each statement, as a call of fenced_incarnation_ok() (true, or an
// error) in its WHERE clause, so it holds alike for the statements and the functions built
// from them. The planner makes it an InitPlan whose result is a one-time filter above the scan
// (TestIncarnationCheckOncePerStatement reads the plans): it runs once per statement, before
// any row is read or changed, and raises even when no row matches. The recorded incarnation
// is read in every call, so a BumpEpoch by another process takes effect at the next
// statement. Caching a passed check per connection instead was not needed: the check costs a
// few percent, and such a cache would have to be proved safe against a promotion, which keeps
// the standby's sessions open.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/tlsfiles"
)

//go:embed migrations/*.sql
var migrations embed.FS

// maxAttempts bounds how often a call that was rolled back by a serialization failure or a
// deadlock is run again.
const maxAttempts = 5

// execMode prepares each call once per connection and then executes it in one round trip
// (see the package documentation).
const execMode = pgx.QueryExecModeCacheStatement

// Driver is the PostgreSQL backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	pool  *pgxpool.Pool
	owned bool
	mode  atomic.Int32 // modeUnknown until detect has a conclusive answer

	listen listener // NotifyReleased's connection and subscribers (notify.go)

	// beforeLostRaceRead, when set by a test, runs between a refused acquisition and the read
	// that names the winner.
	beforeLostRaceRead func()
}

var (
	_ driver.Driver            = (*Driver)(nil)
	_ driver.DurabilityChecker = (*Driver)(nil)
	_ driver.Granter           = (*Driver)(nil)
)

// New returns a driver over a pool the caller opened and keeps ownership of: Close leaves it
// open.
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// DefaultMaxConns is the least size of the pool Open creates when the URL does not set
// pool_max_conns. pgxpool's own default, max(4, number of CPUs), would make 16 concurrent
// callers on a small machine wait for 4 connections; each fenced operation holds a connection
// for one round trip, so a pool this size serves that many callers without queueing, and
// connections are only opened when callers need them.
const DefaultMaxConns = 16

// Open connects to the server at a postgres:// or postgresql:// URL (pgxpool's parameters,
// such as pool_max_conns, and runtime parameters such as search_path are accepted). The pool
// holds up to pool_max_conns connections; when the URL does not say, DefaultMaxConns or
// pgxpool's default if that is larger. The
// returned driver owns its pool and closes it in Close; New takes a pool of the caller's.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	if !strings.HasPrefix(rawURL, "postgres://") && !strings.HasPrefix(rawURL, "postgresql://") {
		return nil, errors.New("open postgres: the URL does not start with postgres:// or postgresql://")
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		// pgx's parse errors already hide the password.
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if err := refuseTLSFallback(cfg.ConnConfig); err != nil {
		return nil, err
	}
	if u, err := url.Parse(rawURL); err == nil && !u.Query().Has("pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, DefaultMaxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return &Driver{pool: pool, owned: true}, nil
}

// refuseTLSFallback refuses a configuration that would try a server beyond loopback both with
// and without TLS: pgx's sslmode=prefer, its default when neither the URL nor $PGSSLMODE names
// one, falls back to plain text when the TLS attempt fails (and allow tries plain text first),
// so a URL that looks encrypted could run in the clear, with no sign of it. The operator says
// which they mean: disable, or require, verify-ca, verify-full. Loopback hosts and Unix
// sockets keep pgx's default: their traffic does not cross a network.
func refuseTLSFallback(cfg *pgx.ConnConfig) error {
	withTLS, plain := cfg.TLSConfig != nil, cfg.TLSConfig == nil
	remote := ""
	if !loopback(cfg.Host) {
		remote = cfg.Host
	}
	for _, f := range cfg.Fallbacks {
		withTLS, plain = withTLS || f.TLSConfig != nil, plain || f.TLSConfig == nil
		if remote == "" && !loopback(f.Host) {
			remote = f.Host
		}
	}
	if withTLS && plain && remote != "" {
		return fmt.Errorf("open postgres: the URL's sslmode (prefer, pgx's default, or allow) falls back to plain text with %s when TLS fails; set sslmode=verify-full (with sslrootcert), require, or disable", remote)
	}
	return nil
}

// loopback reports whether host, as pgx resolved it from the URL, is a Unix socket's directory
// or a loopback name or address.
func loopback(host string) bool {
	if strings.HasPrefix(host, "/") || strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Pool returns the underlying pool.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Close closes the pool if Open created it.
func (d *Driver) Close() error {
	d.stopListening()
	if d.owned {
		d.pool.Close()
	}
	return nil
}

// latestVersion is the highest embedded migration's number.
func latestVersion() (int, []string, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return 0, nil, err
	}
	sort.Strings(names)
	latest := 0
	for _, name := range names {
		v, err := migrationVersion(name)
		if err != nil {
			return 0, nil, err
		}
		latest = max(latest, v)
	}
	return latest, names, nil
}

func migrationVersion(name string) (int, error) {
	v, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, "migrations/"), "_", 2)[0])
	if err != nil {
		return 0, fmt.Errorf("migration %s: bad version: %w", name, err)
	}
	return v, nil
}

// Migrate applies the embedded migrations that have not run yet, records the server's
// incarnation if none is recorded, and installs the routines whose bodies differ from the
// code's, in one transaction that first takes an advisory lock, so that concurrent calls apply
// each migration once. The transaction is READ COMMITTED whatever the server's default, so that
// reads after the lock wait see what the previous holder committed.
//
// Connected as a role that Grant gave only the routines, Migrate changes nothing: it checks
// that the schema and the routines are current and fails if they are not.
func (d *Driver) Migrate(ctx context.Context) error {
	latest, names, err := latestVersion()
	if err != nil {
		return err
	}
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	var mayMigrate *bool
	if err := tx.QueryRow(ctx, sqlMayMigrate).Scan(&mayMigrate); err != nil {
		return fmt.Errorf("check migration rights: %w", classify(err))
	}
	if mayMigrate != nil && !*mayMigrate {
		return checkCurrent(ctx, tx, latest)
	}
	// The schema is current nearly every time: see so first with reads alone, so that a
	// read-only server (a hot standby) serves reads, and a current schema takes no lock.
	version := 0
	if mayMigrate != nil {
		current, v, err := isCurrent(ctx, tx, latest)
		if err != nil {
			return err
		}
		if current {
			return tx.Commit(ctx)
		}
		version = v
	}
	var readOnly bool
	if err := tx.QueryRow(ctx, sqlReadOnly).Scan(&readOnly); err != nil {
		return fmt.Errorf("check whether the server is read-only: %w", classify(err))
	}
	if readOnly {
		return driver.NotApplied(fmt.Errorf("the schema needs migrating (it is at version %d, this code needs %d) and %w",
			version, latest, driver.ErrReadOnly))
	}
	if _, err := tx.Exec(ctx, sqlMigrateLock, int64(migrateLockKey)); err != nil {
		return fmt.Errorf("lock migrations: %w", classify(err))
	}
	if _, err := tx.Exec(ctx, sqlMigrationsTable); err != nil {
		return fmt.Errorf("create migrations table: %w", classify(err))
	}
	var current int
	if err := tx.QueryRow(ctx, sqlSchemaVersion).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", classify(err))
	}
	for _, name := range names {
		version, err := migrationVersion(name)
		if err != nil {
			return err
		}
		if version <= current {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, string(body)); err != nil {
			return fmt.Errorf("migration %s: %w", name, classify(err))
		}
		if _, err := tx.Exec(ctx, sqlMigrationsRecord, version); err != nil {
			return fmt.Errorf("record migration %s: %w", name, classify(err))
		}
	}
	if _, err := tx.Exec(ctx, sqlRecordIncarnation); err != nil {
		return fmt.Errorf("record the server's incarnation: %w", classify(err))
	}
	if err := installRoutines(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit migrations: %w", classify(err))
	}
	return nil
}

// isCurrent reports, reading only, whether Migrate has nothing to do: the schema is at the
// latest version, every routine is the code's, and the incarnation is recorded. It also returns
// the schema's version.
func isCurrent(ctx context.Context, tx pgx.Tx, latest int) (bool, int, error) {
	var version int
	if err := tx.QueryRow(ctx, sqlSchemaVersion).Scan(&version); err != nil {
		return false, 0, fmt.Errorf("read schema version: %w", classify(err))
	}
	if version != latest {
		return false, version, nil
	}
	_, stale, err := staleRoutines(ctx, tx)
	if err != nil || len(stale) > 0 {
		return false, version, err
	}
	var recorded bool
	err = tx.QueryRow(ctx, sqlIncarnationRecorded).Scan(&recorded)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, version, fmt.Errorf("read the recorded incarnation: %w", classify(err))
	}
	return recorded, version, nil
}

// staleRoutines returns the routines that are missing from the schema or whose body differs
// from the code's, and the schema (the first existing one on the search path).
func staleRoutines(ctx context.Context, tx pgx.Tx) (schema string, stale []routine, err error) {
	var s pgtype.Text
	if err := tx.QueryRow(ctx, sqlCurrentSchema).Scan(&s); err != nil {
		return "", nil, fmt.Errorf("read current schema: %w", classify(err))
	}
	if !s.Valid {
		return "", nil, errors.New("read current schema: no schema on the search path exists")
	}
	rows, err := tx.Query(ctx, sqlInstalledRoutines)
	if err != nil {
		return "", nil, fmt.Errorf("list routines: %w", classify(err))
	}
	installed := map[string]string{}
	var name, body string
	if _, err := pgx.ForEachRow(rows, []any{&name, &body}, func() error { installed[name] = body; return nil }); err != nil {
		return "", nil, fmt.Errorf("list routines: %w", classify(err))
	}
	for _, r := range routines {
		if b, ok := installed[r.name]; !ok || b != r.body() {
			stale = append(stale, r)
		}
	}
	return s.String, stale, nil
}

// installRoutines creates or replaces the stale routines, owned by the current user, and
// takes EXECUTE away from PUBLIC (PostgreSQL grants it to PUBLIC by default).
func installRoutines(ctx context.Context, tx pgx.Tx) error {
	schema, stale, err := staleRoutines(ctx, tx)
	if err != nil {
		return err
	}
	for _, sig := range retiredRoutines {
		if _, err := tx.Exec(ctx, "DROP FUNCTION IF EXISTS "+sig); err != nil {
			return fmt.Errorf("drop retired routine %s: %w", sig, classify(err))
		}
	}
	if len(stale) > 0 { // the routines that check prefixes read it
		if _, err := tx.Exec(ctx, sqlGrantsTable); err != nil {
			return fmt.Errorf("create fenced_grants: %w", classify(err))
		}
		if _, err := tx.Exec(ctx, "REVOKE ALL ON TABLE fenced_grants FROM PUBLIC"); err != nil {
			return fmt.Errorf("revoke fenced_grants from public: %w", classify(err))
		}
	}
	for _, r := range stale {
		if _, err := tx.Exec(ctx, r.create(pgx.Identifier{schema}.Sanitize())); err != nil {
			return fmt.Errorf("install routine %s: %w", r.name, classify(err))
		}
		if _, err := tx.Exec(ctx, "REVOKE ALL ON FUNCTION "+r.signature()+" FROM PUBLIC"); err != nil {
			return fmt.Errorf("revoke routine %s from public: %w", r.name, classify(err))
		}
	}
	return nil
}

// checkCurrent is Migrate for a role that may only call the routines.
func checkCurrent(ctx context.Context, tx pgx.Tx, latest int) error {
	var version int
	if err := tx.QueryRow(ctx, rtSchemaVersion.call(), execMode).Scan(&version); err != nil {
		return fmt.Errorf("read schema version: %w", classify(err))
	}
	if version < latest {
		return fmt.Errorf("the schema is at version %d, the code needs %d, and this user may not migrate it: run migrate as the schema's owner", version, latest)
	}
	_, stale, err := staleRoutines(ctx, tx)
	if err != nil {
		return err
	}
	if len(stale) > 0 {
		return fmt.Errorf("routine %s is not the code's, and this user may not replace it: run migrate as the schema's owner", stale[0].name)
	}
	return tx.Commit(ctx)
}

// Grant takes every right on the fenced tables away from PUBLIC and from role, and gives role
// USAGE on the schema and EXECUTE on the routines spec.Access includes (installing any that are
// stale first), revoking EXECUTE on the others, so that granting again with a lower level takes
// rights away. It records spec.Prefixes (none: the empty prefix, every resource) as the role's rows of
// fenced_grants, which the routines check. The role must exist (CREATE ROLE name LOGIN ...) and
// the schema must be migrated. Run it as the user that migrated, the owner of the tables and
// routines. Everything is one transaction.
//
// Revoking reaches only the role's own rights and PUBLIC's: before committing, Grant checks what
// the role can still do through its memberships (an application's group role,
// pg_write_all_data), including those it may only SET ROLE to, and refuses, changing nothing,
// a superuser, a role that may still insert, update, delete, truncate or add triggers to
// fenced's tables, and one that may execute a routine its level excludes.
func (d *Driver) Grant(ctx context.Context, role string, spec driver.GrantSpec) error {
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var readOnly bool
	if err := tx.QueryRow(ctx, sqlReadOnly).Scan(&readOnly); err != nil {
		return fmt.Errorf("check whether the server is read-only: %w", classify(err))
	}
	if readOnly {
		return driver.NotApplied(driver.ErrReadOnly)
	}
	if _, err := tx.Exec(ctx, sqlMigrateLock, int64(migrateLockKey)); err != nil {
		return fmt.Errorf("lock migrations: %w", classify(err))
	}
	if err := installRoutines(ctx, tx); err != nil {
		return err
	}
	var schema string
	if err := tx.QueryRow(ctx, sqlCurrentSchema).Scan(&schema); err != nil {
		return fmt.Errorf("read current schema: %w", classify(err))
	}
	if _, err := tx.Exec(ctx, sqlGrantsTable); err != nil {
		return fmt.Errorf("create fenced_grants: %w", classify(err))
	}
	r := pgx.Identifier{role}.Sanitize()
	var stmts []string
	for _, t := range fencedTables {
		stmts = append(stmts, "REVOKE ALL ON TABLE "+t+" FROM PUBLIC, "+r)
	}
	for _, rt := range routines {
		stmts = append(stmts, "REVOKE ALL ON FUNCTION "+rt.signature()+" FROM PUBLIC, "+r)
		if rt.granted && spec.Access.Includes(rt.access) {
			stmts = append(stmts, "GRANT EXECUTE ON FUNCTION "+rt.signature()+" TO "+r)
		}
	}
	stmts = append(stmts, "GRANT USAGE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO "+r)
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object
				return &worded{msg: fmt.Sprintf("the role %s does not exist; create it first", role), err: err}
			}
			return fmt.Errorf("grant to role %s: %w", role, classify(err))
		}
	}
	if err := checkConfined(ctx, tx, role, spec.Access); err != nil {
		return err
	}
	prefixes := spec.Prefixes
	if len(prefixes) == 0 {
		prefixes = []string{""}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM fenced_grants WHERE role = $1`, role); err != nil {
		return fmt.Errorf("record prefixes of role %s: %w", role, classify(err))
	}
	for _, p := range prefixes {
		if _, err := tx.Exec(ctx, `INSERT INTO fenced_grants (role, prefix) VALUES ($1, $2) ON CONFLICT DO NOTHING`, role, p); err != nil {
			return fmt.Errorf("record prefixes of role %s: %w", role, classify(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit grant: %w", classify(err))
	}
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	return d.do(ctx, func(c session) error {
		_, err := c.rowCount(ctx, rtProvision, resource)
		return err
	})
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	var (
		acquired, seenFree bool
		epoch, gen         int64
		until              pgtype.Timestamptz
	)
	err := d.do(ctx, func(c session) error {
		return c.queryRow(ctx, rtAcquire, resource, owner, ttl.Microseconds()).
			Scan(&acquired, &epoch, &gen, &until, &seenFree)
	})
	if err != nil {
		return driver.Grant{}, err // ErrNotFound when the resource has no row
	}
	if acquired {
		return driver.Grant{Epoch: epoch, Generation: gen, LeaseUntil: timeOf(until)}, nil
	}
	if seenFree {
		// Refused after waiting on a concurrent acquisition: the statement's snapshot predates
		// the winner, so read the row again to name the holder. The refusal is certain (the
		// statement returned acquired = false), so a read that fails, for instance because ctx
		// ended meanwhile, leaves it not applied: never an unknown outcome.
		if d.beforeLostRaceRead != nil {
			d.beforeLostRaceRead()
		}
		st, err := d.Read(ctx, resource)
		if errors.Is(err, driver.ErrNotFound) {
			return driver.Grant{}, err
		}
		if err != nil {
			return driver.Grant{}, driver.NotApplied(fmt.Errorf("acquisition refused; reading the lease that refused it: %w", err))
		}
		return driver.Grant{}, &driver.BusyError{Epoch: st.Epoch, Generation: st.Generation, LeaseUntil: st.LeaseUntil}
	}
	return driver.Grant{}, &driver.BusyError{Epoch: epoch, Generation: gen, LeaseUntil: timeOf(until)}
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	var until pgtype.Timestamptz
	err := d.do(ctx, func(c session) error {
		return c.queryRow(ctx, rtRenew, l.Resource, l.Owner, l.Generation, l.Epoch, ttl.Microseconds()).Scan(&until)
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
	return d.publish(ctx, rtPublish, l, pub)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, rtPublishAndRelease, l, pub)
}

// publish runs the publication statement, which also records the operation id (sql.go). A
// unique violation on the operation id means a concurrent Resolve or publication recorded it
// first, and the whole statement was rolled back: refused, not an error.
func (d *Driver) publish(ctx context.Context, rt routine, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	var n int64
	err := d.do(ctx, func(c session) error {
		var err error
		n, err = c.rowCount(ctx, rt, l.Resource, l.Owner, l.Generation, l.Epoch,
			nonNil(pub.Payload), pub.SourceVersion, pub.OpID)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "fenced_operations_pkey" {
			n = 0
			return nil
		}
		return err
	})
	return oneRow(n, err)
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	var n int64
	err := d.do(ctx, func(c session) error {
		var err error
		n, err = c.rowCount(ctx, rtRelease, l.Resource, l.Owner, l.Generation, l.Epoch)
		return err
	})
	return oneRow(n, err)
}

// oneRow turns a conditional statement's row count into ok.
func oneRow(n int64, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	if n > 1 {
		return false, fmt.Errorf("statement changed %d rows; the resource key is not unique", n)
	}
	return n == 1, nil
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	var (
		st                 driver.State
		owner              pgtype.Text
		until, publishedAt pgtype.Timestamptz
		now                time.Time
	)
	err := d.do(ctx, func(c session) error {
		st = driver.State{Resource: resource}
		return c.queryRow(ctx, rtRead, resource).Scan(&st.Epoch, &st.Generation, &owner, &until,
			&st.PublishedEpoch, &st.PublishedGeneration, &publishedAt, &st.SourceVersion, &st.PayloadSize,
			&st.CurrentEpoch, &now)
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
	err := d.do(ctx, func(c session) error {
		return c.queryRow(ctx, rtReadPayload, resource).Scan(&gen, &payload)
	})
	if err != nil {
		return nil, 0, err
	}
	return payload, gen, nil
}

func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	op, err := d.operation(ctx, rtResolve, opID)
	if err == nil && op.Outcome == "" {
		return driver.Operation{}, fmt.Errorf("resolve operation %s: nothing recorded after recording it", opID)
	}
	return op, err
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	return d.operation(ctx, rtReadOperation, opID)
}

func (d *Driver) operation(ctx context.Context, rt routine, opID string) (driver.Operation, error) {
	var (
		op         driver.Operation
		resource   pgtype.Text
		epoch, gen pgtype.Int8
		at         pgtype.Timestamptz
	)
	err := d.do(ctx, func(c session) error {
		op = driver.Operation{OpID: opID}
		return c.queryRow(ctx, rt, opID).Scan(&op.Outcome, &resource, &epoch, &gen, &at)
	})
	if errors.Is(err, driver.ErrNotFound) {
		return driver.Operation{OpID: opID}, nil
	}
	if err != nil {
		return driver.Operation{}, err
	}
	op.Resource, op.Epoch, op.Generation, op.RecordedAt = resource.String, epoch.Int64, gen.Int64, timeOf(at)
	return op, nil
}

// BumpEpoch frees every lease, advances the epoch and records the server's incarnation, in one
// statement.
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	var epoch int64
	err := d.do(ctx, func(c session) error {
		return c.queryRow(ctx, rtBumpEpoch).Scan(&epoch)
	})
	return epoch, err
}

func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	var n int64
	err := d.do(ctx, func(c session) error {
		var err error
		n, err = c.rowCount(ctx, rtPrune, age.Microseconds())
		return err
	})
	return n, err
}

// sqlDurability reads, on one of the driver's own connections (synchronous_commit can be set
// per role, database or session), the settings under which an acknowledged commit can be lost,
// and the fenced tables that are not permanent (relpersistence 'p'). pg_class and these
// settings are readable by every role.
const sqlDurability = `SELECT current_setting('fsync'), current_setting('synchronous_commit'),
    current_setting('full_page_writes'), current_setting('synchronous_standby_names'),
    coalesce((SELECT string_agg(relname, ', ' ORDER BY relname) FROM pg_class
        WHERE oid IN (to_regclass('fenced_resources'), to_regclass('fenced_operations'),
                      to_regclass('fenced_meta'), to_regclass('fenced_schema_migrations'))
          AND relpersistence <> 'p'), '')`

// CheckDurability warns about fsync off, full_page_writes off, synchronous_commit off, and
// synchronous_commit local while synchronous standbys are configured, and about fenced tables
// that are UNLOGGED or temporary.
//
// synchronous_commit off acknowledges a commit before its WAL reaches disk, so a server crash
// loses the last acknowledged generations. local waits for the local flush only, which is
// safe on a single server but lets a failover to a synchronous standby lose acknowledged
// commits; it is reported only when synchronous_standby_names is set. remote_write (the
// standby has written but not flushed) is accepted: losing it needs the primary and the
// standby's operating system to fail together.
//
// When the settings cannot be read the error is returned; the store then only warns, unless
// it is strict.
func (d *Driver) CheckDurability(ctx context.Context) ([]string, error) {
	var fsync, syncCommit, fpw, standbys, volatile string
	err := d.do(ctx, func(c session) error {
		return c.QueryRow(ctx, sqlDurability, execMode).Scan(&fsync, &syncCommit, &fpw, &standbys, &volatile)
	})
	if err != nil {
		return nil, fmt.Errorf("read durability settings: %w", err)
	}
	var out []string
	if fsync == "off" {
		out = append(out, "PostgreSQL fsync is off: a crash of the server's machine can lose or corrupt acknowledged commits")
	}
	switch {
	case syncCommit == "off":
		out = append(out, "PostgreSQL synchronous_commit is off: a server crash loses the most recent acknowledged commits")
	case syncCommit == "local" && standbys != "":
		out = append(out, "PostgreSQL synchronous_commit is local while synchronous_standby_names is set: a failover can lose acknowledged commits")
	}
	if fpw == "off" {
		out = append(out, "PostgreSQL full_page_writes is off: a crash of the server's machine can leave torn, corrupt pages")
	}
	if volatile != "" {
		out = append(out, fmt.Sprintf("fenced tables %s are not logged: crash recovery empties them and resets generations", volatile))
	}
	return out, nil
}

// do runs one call on a connection of the pool, again while the server reports that it was
// rolled back by a serialization failure or a deadlock (so it certainly did not take effect),
// at most maxAttempts times. The error it returns has passed through classify.
func (d *Driver) do(ctx context.Context, call func(session) error) error {
	for attempt := 1; ; attempt++ {
		c, err := d.pool.Acquire(ctx)
		if err != nil {
			// Waiting for or dialling a connection sends no statement.
			return driver.NotApplied(connectionFailure(err))
		}
		direct, err := d.direct(ctx, c)
		if err != nil {
			c.Release()
			// The detection changes nothing, and the operation was not sent.
			return driver.NotApplied(fmt.Errorf("read privileges: %w", err))
		}
		err = call(session{c, direct})
		c.Release()
		if !rolledBack(err) || attempt == maxAttempts || ctx.Err() != nil {
			return classify(err)
		}
	}
}

// Modes of a driver: whether it sends the statements or calls the routines.
const (
	modeUnknown int32 = iota
	modeDirect
	modeRoutines
)

// sqlPrivileges tells whether this user may update fenced_resources and call the incarnation
// check (both NULL before Migrate created them), and whether it may call fenced_read, which
// every level Grant gives includes.
// has_table_privilege counts role memberships and grants to PUBLIC.
const sqlPrivileges = `SELECT has_table_privilege(to_regclass('fenced_resources'), 'UPDATE')
        AND has_function_privilege(to_regprocedure('fenced_incarnation_ok()'), 'EXECUTE'),
    has_function_privilege(to_regprocedure('fenced_read(text)'), 'EXECUTE')`

// direct reports whether to send the statements rather than call the routines. A user that may
// write the tables sends the statements; one that Grant set up, which may not, calls the
// routines. The first call asks the server once and keeps a conclusive answer; before Migrate
// (no tables, no routines) the answer is direct and not kept, so the statement fails and says
// why. Every connection of the pool logs in as the same user, so the answer holds for all.
// The query is sent with the simple protocol: it is not worth preparing.
func (d *Driver) direct(ctx context.Context, c *pgxpool.Conn) (bool, error) {
	switch d.mode.Load() {
	case modeDirect:
		return true, nil
	case modeRoutines:
		return false, nil
	}
	var mayWrite, mayCall pgtype.Bool
	if err := c.QueryRow(ctx, sqlPrivileges, pgx.QueryExecModeSimpleProtocol).Scan(&mayWrite, &mayCall); err != nil {
		return false, err
	}
	switch {
	case mayWrite.Valid && mayWrite.Bool:
		d.mode.Store(modeDirect)
		return true, nil
	case mayWrite.Valid && mayCall.Valid && mayCall.Bool:
		d.mode.Store(modeRoutines)
		return false, nil
	}
	return true, nil
}

// session is a connection of the pool and the driver's mode.
type session struct {
	*pgxpool.Conn
	direct bool
}

// queryRow runs rt's statement, or calls its routine, for the rows it returns. In direct mode
// a routine with a statement before (the row lock, Resolve's INSERT) is sent as a batch of the
// statements: one round trip and one implicit transaction, as the routine's call is.
func (c session) queryRow(ctx context.Context, rt routine, args ...any) pgx.Row {
	return deniedRow{c.queryRowAs(ctx, rt, args...), c, rt, args}
}

func (c session) queryRowAs(ctx context.Context, rt routine, args ...any) pgx.Row {
	if !c.direct {
		return c.QueryRow(ctx, rt.call(), append([]any{execMode}, args...)...)
	}
	if b := batch(rt, args); b != nil {
		return batchRow{c.SendBatch(ctx, b), b.Len() - 1}
	}
	return c.QueryRow(ctx, rt.statement, append([]any{execMode}, args...)...)
}

// deniedRow is a row whose error, when the server refused it for lack of rights, names the
// operation and the role (denied).
type deniedRow struct {
	pgx.Row
	c    session
	rt   routine
	args []any
}

func (r deniedRow) Scan(dest ...any) error { return r.c.denied(r.rt, r.args, r.Row.Scan(dest...)) }

// denied turns the server's refusal for lack of rights into a *driver.PermissionError naming
// rt's operation and the user this connection logged in as: insufficient_privilege (42501,
// a routine the role was not granted) or the prefix check's FNC02. Both are errors, so the
// call's transaction was rolled back and nothing changed.
func (c session) denied(rt routine, args []any, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "42501" && pgErr.Code != sqlstatePrefix) {
		return err
	}
	e := &driver.PermissionError{Role: c.Conn.Conn().Config().User, Operation: rt.op, Err: err}
	if pgErr.Code == sqlstatePrefix && len(args) > 0 {
		e.Resource, _ = args[0].(string)
	}
	return e
}

// rowCount runs rt's statement, or calls its routine, for the number of rows it changed.
func (c session) rowCount(ctx context.Context, rt routine, args ...any) (int64, error) {
	n, err := c.rowCountAs(ctx, rt, args...)
	return n, c.denied(rt, args, err)
}

func (c session) rowCountAs(ctx context.Context, rt routine, args ...any) (int64, error) {
	if !c.direct {
		var n int64
		err := c.QueryRow(ctx, rt.call(), append([]any{execMode}, args...)...).Scan(&n)
		return n, err
	}
	if b := batch(rt, args); b != nil {
		br := c.SendBatch(ctx, b)
		var tag pgconn.CommandTag
		var err error
		for i := 0; i < b.Len() && err == nil; i++ {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag.RowsAffected(), err
	}
	tag, err := c.Exec(ctx, rt.statement, append([]any{execMode}, args...)...)
	return tag.RowsAffected(), err
}

// batch returns the statements of rt that run before its last, followed by that one, or nil
// when rt is one statement. pgx sends a batch with the connection's default execution mode
// (prepared and cached unless the URL says otherwise) and one Sync: one implicit transaction.
func batch(rt routine, args []any) *pgx.Batch {
	if !rt.lockFirst && rt.before == "" {
		return nil
	}
	b := &pgx.Batch{}
	if rt.lockFirst {
		b.Queue(sqlLockRow, args[0])
	}
	if rt.before != "" {
		b.Queue(rt.before, args...)
	}
	b.Queue(rt.statement, args...)
	return b
}

// batchRow is the row of a batch's last statement; the statements before it return none.
type batchRow struct {
	br     pgx.BatchResults
	before int
}

func (r batchRow) Scan(dest ...any) error {
	var err error
	for i := 0; i < r.before && err == nil; i++ {
		_, err = r.br.Exec()
	}
	if err == nil {
		err = r.br.QueryRow().Scan(dest...)
	}
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// rolledBack reports whether err is the server's report that the transaction was aborted so
// that it could be retried: serialization failure (40001) or deadlock (40P01).
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// classify is where pgx's errors become the driver's, in one place. No row is ErrNotFound
// (each caller knows what an absent row means). The error is marked driver.ErrNotApplied only
// when the call certainly did not take effect:
//   - the server answered with an ERROR: the call is one autocommit transaction, which the
//     error rolled back (the incarnation check's own error says so too, and is
//     driver.ErrIncarnationChanged);
//   - pgx knows nothing was sent (pgconn.SafeToRetry: a context already done, a busy
//     connection) or the connection could not be made (*pgconn.ConnectError).
//
// A FATAL or PANIC message ends the session and can arrive after the commit, and every other
// failure after sending (a broken connection, a timeout while waiting for the reply) leaves
// the outcome unknown: those are returned as they are. Nothing is ever turned into a refusal.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.ErrNotFound
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) { // before the server's errors: a refused login is one
		return driver.NotApplied(connectionFailure(err))
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		severity := pgErr.SeverityUnlocalized
		if severity == "" {
			severity = pgErr.Severity
		}
		switch {
		case severity == "FATAL" || severity == "PANIC":
			return err
		case pgErr.Code == sqlstateIncarnation:
			return driver.NotApplied(incarnationError(pgErr))
		case pgErr.Code == "25006": // read_only_sql_transaction: a hot standby
			return driver.ReadOnly(err)
		case rolledBack(err):
			return driver.NotApplied(fmt.Errorf("run statement: rolled back by the server on every attempt: %w", err))
		}
		return driver.NotApplied(err)
	}
	if pgconn.SafeToRetry(err) {
		return driver.NotApplied(err)
	}
	return err
}

// incarnationPattern reads the two incarnations from fenced_incarnation_ok's message.
var incarnationPattern = regexp.MustCompile(`incarnation (\S+) differs from (\S+) recorded`)

func incarnationError(pgErr *pgconn.PgError) error {
	m := incarnationPattern.FindStringSubmatch(pgErr.Message)
	if m == nil {
		return fmt.Errorf("%w: %s", driver.ErrIncarnationChanged, pgErr.Message)
	}
	return &driver.IncarnationError{Server: m[1], Recorded: m[2]}
}

// worded is an error in the user's terms, whose original stays reachable with errors.As.
type worded struct {
	msg string
	err error
}

func (e *worded) Error() string { return e.msg }
func (e *worded) Unwrap() error { return e.err }

// connectionFailure words an error from getting a connection.
func connectionFailure(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return fmt.Errorf("wait for a connection: %w", err)
	}
	addr := ce.Config.Host
	if !strings.HasPrefix(addr, "/") {
		addr = net.JoinHostPort(addr, strconv.Itoa(int(ce.Config.Port)))
	}
	var (
		pgErr *pgconn.PgError
		dns   *net.DNSError
		errno syscall.Errno
		op    *net.OpError
		cause string
	)
	tlsCause, isTLS := tlsfiles.Cause(err, "sslrootcert")
	switch {
	case isTLS:
		cause = tlsCause
	case errors.As(err, &pgErr): // refused by the server: authentication, no such database
		cause = pgErr.Message
	case errors.As(err, &dns):
		cause = dns.Error()
	case errors.As(err, &errno):
		cause = errno.Error()
	case errors.As(err, &op):
		cause = op.Err.Error()
	default:
		cause = errors.Unwrap(ce).Error()
		if i := strings.IndexByte(cause, '\n'); i >= 0 { // joined attempts: the first says it
			cause = cause[:i]
		}
	}
	// The server's address and the cause, once: pgx's own message lists every address and
	// every attempt (with TLS, then without), each with the same cause.
	return &worded{msg: fmt.Sprintf("cannot connect to the PostgreSQL server at %s: %s", addr, cause), err: err}
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
