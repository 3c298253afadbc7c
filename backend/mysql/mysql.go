// Package mysql runs the fenced protocol on MySQL or MariaDB (InnoDB), through database/sql
// and github.com/go-sql-driver/mysql.
//
// Every operation is one autocommit statement, so each is its own transaction: it either
// commits whole or is rolled back whole. Expiry is judged by UTC_TIMESTAMP(6) on the server,
// and every time is stored as a UTC DATETIME(6), so no session's time_zone setting, and no
// client clock, ever moves an expiry.
//
// MySQL has no UPDATE ... RETURNING. An acquisition gets its new generation in the same reply
// through LAST_INSERT_ID(generation + 1), and a renewal its new expiry through
// LAST_INSERT_ID(expiry in microseconds); both are trusted only when the statement matched
// exactly one row. The expiry of a new acquisition is read right after its statement (see
// Driver.Acquire). Matched rows, not changed rows, decide: connections must be made with
// clientFoundRows=true, or a renewal that happens to write the expiry already stored would
// look refused. Migrate checks this.
package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced/driver"
)

//go:embed migrations/*.sql
var migrations embed.FS

// ErrNotApplied marks an error after which the statement is known not to have taken effect:
// the server rolled it back (a lock wait timeout, or a deadlock that outlasted the retries).
// Any other error from a mutating call may mean the statement committed and its reply was lost.
var ErrNotApplied = errors.New("statement rolled back, nothing changed")

// Driver is the MySQL/MariaDB backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	db    *sql.DB
	owned bool
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a handle the caller opened and keeps ownership of. The handle must
// use the go-sql-driver/mysql driver, select a database, and set clientFoundRows=true (see
// DSN), so that an UPDATE reports the rows it matched rather than the rows it changed.
//
// Nothing else in the DSN matters to correctness: parseTime and loc are irrelevant because
// times are read as integer microseconds, and time_zone is irrelevant because the clock is
// UTC_TIMESTAMP(6) and the columns are DATETIME. The pool size is the caller's choice; every
// call uses one connection for one statement (two for a refused or granted acquisition).
func New(db *sql.DB) *Driver { return &Driver{db: db} }

// DSN translates a URL of the form mysql://user:password@host:port/database?param=value into
// the go-sql-driver/mysql data source name that Open uses. Query parameters are passed to
// go-sql-driver/mysql as they are (its own options, or server variables such as time_zone);
// clientFoundRows is always set, and asking for clientFoundRows=false is an error.
// interpolateParams defaults to true: the driver then sends each statement with its arguments
// escaped in one round trip, instead of preparing it, executing it and closing it, which
// halves the latency of every operation under load. Pass interpolateParams=false to prepare.
func DSN(rawURL string) (string, error) {
	cfg, err := parseURL(rawURL)
	if err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}

// Open connects to the database a mysql:// URL names (see DSN). The returned driver owns the
// pool and closes it in Close. "mariadb://" is accepted as a synonym.
func Open(rawURL string) (*Driver, error) {
	cfg, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("open mysql: %w", err)
	}
	return &Driver{db: sql.OpenDB(connector), owned: true}, nil
}

func parseURL(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parse mysql url: %w", err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return nil, fmt.Errorf("parse mysql url: scheme %q is not mysql://", u.Scheme)
	}
	q := u.Query()
	if v := q.Get("clientFoundRows"); v != "" && v != "true" {
		return nil, fmt.Errorf("parse mysql url: clientFoundRows=%s; fenced needs matched rows (true)", v)
	}
	q.Del("clientFoundRows")
	if !q.Has("interpolateParams") {
		q.Set("interpolateParams", "true")
	}
	// The options go through go-sql-driver's own parser, so every option it knows works here.
	cfg, err := mysql.ParseDSN("/?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("parse mysql url options: %w", err)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "3306"
	}
	cfg.Net, cfg.Addr = "tcp", net.JoinHostPort(host, port)
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	if cfg.DBName = strings.TrimPrefix(u.Path, "/"); cfg.DBName == "" {
		return nil, errors.New("parse mysql url: no database named (mysql://user@host/DATABASE)")
	}
	cfg.ClientFoundRows = true
	return cfg, nil
}

// DB returns the underlying handle.
func (d *Driver) DB() *sql.DB { return d.db }

// Close closes the pool if Open created it.
func (d *Driver) Close() error {
	if d.owned {
		return d.db.Close()
	}
	return nil
}

// migrationLockWait is how long Migrate waits for a concurrent migration when ctx has no deadline.
const migrationLockWait = time.Minute

// Migrate applies the embedded migrations that have not run yet. Concurrent callers, in any
// process, are serialized by a named server lock (GET_LOCK) held on one connection. DDL commits
// implicitly in MySQL, so a migration is not atomic with its version row; each migration is
// written to be harmless when run again.
func (d *Driver) Migrate(ctx context.Context) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return translate(err)
	}
	defer conn.Close()

	wait := migrationLockWait
	if deadline, ok := ctx.Deadline(); ok {
		wait = max(time.Until(deadline), time.Second)
	}
	// Lock names are server-wide and at most 64 characters, hence the digest of the database.
	const lockName = `CONCAT('fenced.migrate.', MD5(DATABASE()))`
	var locked sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+lockName+`, ?)`, int(wait.Seconds())).Scan(&locked); err != nil {
		return fmt.Errorf("take migration lock: %w", translate(err))
	}
	if locked.Int64 != 1 {
		return fmt.Errorf("take migration lock: another migration held it for %s", wait)
	}
	defer func() {
		var released sql.NullInt64
		err := conn.QueryRowContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(`+lockName+`)`).Scan(&released)
		if err != nil || released.Int64 != 1 {
			// A connection that may still hold the lock must not go back to the pool.
			_ = conn.Raw(func(any) error { return sqldriver.ErrBadConn })
		}
	}()

	if err := migrate(ctx, conn); err != nil {
		return err
	}
	return checkFoundRows(ctx, conn)
}

func migrate(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS fenced_schema_migrations (
    version    INT         NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL
) ENGINE = InnoDB`); err != nil {
		return fmt.Errorf("create migrations table: %w", translate(err))
	}
	var current int
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM fenced_schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", translate(err))
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
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
		for _, stmt := range statements(string(body)) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("apply migration %s: %w", name, translate(err))
			}
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO fenced_schema_migrations (version, applied_at)
VALUES (?, UTC_TIMESTAMP(6))`, version); err != nil {
			return fmt.Errorf("record migration %s: %w", name, translate(err))
		}
	}
	return nil
}

// statements splits a migration into its statements: the driver sends one at a time, since
// multiStatements is off by default and should stay off. A statement ends with ';' at the end
// of a line.
func statements(body string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(body) {
		cur.WriteString(line)
		if strings.HasSuffix(strings.TrimSpace(line), ";") && !strings.HasPrefix(strings.TrimSpace(line), "--") {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, cur.String())
	}
	return out
}

// checkFoundRows refuses a connection that reports changed rows instead of matched rows: on it
// a renewal writing the expiry already stored would be reported as refused.
func checkFoundRows(ctx context.Context, conn *sql.Conn) error {
	res, err := conn.ExecContext(ctx, `UPDATE fenced_schema_migrations SET applied_at = applied_at
ORDER BY version DESC LIMIT 1`)
	if err != nil {
		return fmt.Errorf("check matched rows: %w", translate(err))
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.New("check matched rows: the connection reports changed rows, not matched rows; " +
			"open it with clientFoundRows=true")
	}
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	_, err := d.exec(ctx, sqlProvision, resource)
	return err
}

// Acquire runs the conditional UPDATE, which hands back the new generation in its reply, then
// reads the row once, for the expiry the server stored (informational) or, after a refusal, for
// the holder's generation and expiry. When the row no longer holds this acquisition by the
// time it is read (it expired and was taken in between) the reported expiry is the read's own
// time, by which the lease had ended; when that read fails the expiry is reported as zero.
// Either way the acquisition itself is certain and is returned.
func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	res, err := d.exec(ctx, sqlAcquire, acquireArgs(resource, owner, ttl.Microseconds())...)
	if err != nil {
		return driver.Grant{}, err
	}
	matched, err := oneRow(res)
	if err != nil {
		return driver.Grant{}, err
	}
	if !matched {
		gen, _, until, _, err := d.readLease(ctx, resource)
		if err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{}, &driver.BusyError{Generation: gen, LeaseUntil: until}
	}
	gen, err := res.LastInsertId()
	if err != nil || gen < 1 {
		return driver.Grant{}, fmt.Errorf("read acquired generation (%d): the acquisition happened: %w", gen, err)
	}
	grant := driver.Grant{Generation: gen}
	if g, o, until, now, err := d.readLease(ctx, resource); err == nil {
		grant.LeaseUntil = now
		if g == gen && o == owner {
			grant.LeaseUntil = until
		}
	}
	return grant, nil
}

// readLease is the short read that Acquire makes after its statement.
func (d *Driver) readLease(ctx context.Context, resource string) (gen int64, owner string, until, now time.Time, err error) {
	var (
		o    sql.NullString
		u    sql.NullInt64
		nowU int64
	)
	err = d.db.QueryRowContext(ctx, sqlReadLease, resource).Scan(&gen, &o, &u, &nowU)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", time.Time{}, time.Time{}, driver.ErrNotFound
	}
	if err != nil {
		return 0, "", time.Time{}, time.Time{}, translate(err)
	}
	return gen, o.String, fromNullMicros(u), fromMicros(nowU), nil
}

// Renew returns the expiry it stored, which comes back in the statement's reply (see sqlRenew).
func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	res, err := d.exec(ctx, sqlRenew, ttl.Microseconds(), l.Resource, l.Owner, l.Generation)
	if err != nil {
		return time.Time{}, false, err
	}
	if ok, err := oneRow(res); !ok || err != nil {
		return time.Time{}, false, err
	}
	until, err := res.LastInsertId()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read renewed expiry: the renewal happened: %w", err)
	}
	return fromMicros(until), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	return d.execOne(ctx, sqlPublish, publishArgs(l.Resource, l.Owner, l.Generation, payload)...)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	return d.execOne(ctx, sqlPublishAndRelease, publishArgs(l.Resource, l.Owner, l.Generation, payload)...)
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return d.execOne(ctx, sqlRelease, releaseArgs(l.Resource, l.Owner, l.Generation)...)
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	var (
		st                 = driver.State{Resource: resource}
		owner              sql.NullString
		until, publishedAt sql.NullInt64
		now                int64
	)
	err := d.db.QueryRowContext(ctx, sqlRead, resource).Scan(&st.Generation, &owner, &until,
		&st.PublishedGeneration, &publishedAt, &st.PayloadSize, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.State{}, driver.ErrNotFound
	}
	if err != nil {
		return driver.State{}, translate(err)
	}
	st.Owner = owner.String
	st.LeaseUntil = fromNullMicros(until)
	st.PublishedAt = fromNullMicros(publishedAt)
	st.Now = fromMicros(now)
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	var (
		gen     int64
		payload []byte
	)
	err := d.db.QueryRowContext(ctx, sqlReadPayload, resource).Scan(&gen, &payload)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, driver.ErrNotFound
	}
	if err != nil {
		return nil, 0, translate(err)
	}
	return payload, gen, nil
}

// deadlockAttempts bounds how often one statement is run when InnoDB picks it as a deadlock
// victim. A victim's transaction (here: the single statement) was rolled back whole, so
// running it again cannot apply it twice.
const deadlockAttempts = 3

// exec runs one autocommit statement.
func (d *Driver) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	for attempt := 1; ; attempt++ {
		res, err := d.db.ExecContext(ctx, query, args...)
		if err == nil {
			return res, nil
		}
		if attempt < deadlockAttempts && serverError(err) == erLockDeadlock && ctx.Err() == nil {
			continue
		}
		return nil, translate(err)
	}
}

// execOne runs a conditional UPDATE; ok is true when it matched exactly one row.
func (d *Driver) execOne(ctx context.Context, query string, args ...any) (bool, error) {
	res, err := d.exec(ctx, query, args...)
	if err != nil {
		return false, err
	}
	return oneRow(res)
}

// oneRow reports whether a statement matched exactly one row. With clientFoundRows the count is
// of matched rows, so an UPDATE that writes the values already stored still counts.
func oneRow(res sql.Result) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n > 1 {
		return false, fmt.Errorf("statement matched %d rows; the resource key is not unique", n)
	}
	return n == 1, nil
}

// Server error numbers that change what an error means.
const (
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
)

func serverError(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// translate is the one place where a server or connection error gets its meaning.
//
// A deadlock and a lock wait timeout both roll back our single-statement transaction, so
// either is certain not to have applied (with innodb_rollback_on_timeout off, a timeout rolls
// back the statement, which is the whole transaction here). exec retries deadlocks, which
// InnoDB resolves at once, but not lock wait timeouts: one means another session held the
// row for innodb_lock_wait_timeout (50 s by default), so waiting that long again would
// overrun the caller's expectations of a lease operation while hiding the stuck session.
func translate(err error) error {
	switch serverError(err) {
	case erLockDeadlock:
		return fmt.Errorf("%w: chosen as a deadlock victim: %w", ErrNotApplied, err)
	case erLockWaitTimeout:
		return fmt.Errorf("%w: lock wait timeout: %w", ErrNotApplied, err)
	}
	return err
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func fromNullMicros(us sql.NullInt64) time.Time {
	if !us.Valid {
		return time.Time{}
	}
	return fromMicros(us.Int64)
}

// TODO(issue 4): the recovery features below are being implemented for this backend; until then
// they fail loudly and the conformance suite's tests for them fail.
var errIssue4Pending = errors.New("mysql backend: epochs, operation ids and source versions are not implemented yet")

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
