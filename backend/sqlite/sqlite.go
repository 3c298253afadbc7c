// Package sqlite runs the fenced protocol on an SQLite database file: the embedded default,
// with nothing to set up.
//
// Every operation is one conditional statement (a publication and an epoch bump: two, together).
// The operations of one Driver queue for one writer, which applies all that are queued in one
// IMMEDIATE transaction with one commit (group commit, see group.go); BEGIN IMMEDIATE takes
// SQLite's write lock up front, so the busy timeout applies to it. Migration is its own
// IMMEDIATE transaction. Expiry is judged by SQLite's
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
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"

	"modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Driver is the SQLite backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	db    *sql.DB
	owned bool
	clock string // replaces nowMicros in every statement when set (WithClockOffsetFile)
	// w queues this driver's writes for one writer goroutine, which applies everything queued
	// in one transaction (group.go). SQLite admits one writer anyway; without the queue,
	// goroutines of one process would meet in SQLite's busy handler, whose growing back-off can
	// starve one writer past the busy timeout (measured: see docs/BENCHMARKS.md). Other
	// processes still meet in the busy handler.
	w writer
	// wc is the writer's connection and its prepared statements (group.go).
	wc writeConn
	// reads are the reads' statements, prepared on the handle once (queryRow).
	readsMu sync.Mutex
	reads   map[string]*sql.Stmt
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
	if err := checkPath(path); err != nil {
		return nil, err
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

// checkPath names the path and the reason when the database file cannot be opened or created
// there; SQLite itself would only say "unable to open database file", at the first statement.
func checkPath(path string) error {
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("open SQLite database %s: it is a directory", path)
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("open SQLite database %s: %w", path, errors.Unwrap(err)) // the reason, e.g. permission denied
	}
	dir := filepath.Dir(path)
	fi, err = os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("open SQLite database %s: the directory %s does not exist", path, dir)
	case err != nil:
		return fmt.Errorf("open SQLite database %s: directory %s: %w", path, dir, errors.Unwrap(err))
	case !fi.IsDir():
		return fmt.Errorf("open SQLite database %s: %s is not a directory", path, dir)
	}
	return nil
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

// The epoch clock (sql.go, epochClock) is registered when the package is loaded, before any
// connection can be opened, so that it exists on every connection, also on a handle passed to
// New.
func init() {
	err := sqlite.RegisterScalarFunction("fenced_epoch_clock_us", 0,
		func(*sqlite.FunctionContext, []sqldriver.Value) (sqldriver.Value, error) {
			return time.Now().UnixMicro(), nil
		})
	if err != nil {
		panic("fenced/backend/sqlite: register fenced_epoch_clock_us: " + err.Error())
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
		return nil, fmt.Errorf("open sqlite: %q is not a URL of the form sqlite:PATH", rawURL)
	}
	path = strings.TrimPrefix(path, "//")
	return Open(path)
}

// DB returns the underlying handle.
func (d *Driver) DB() *sql.DB { return d.db }

// Close gives back the writer's connection and finalizes the prepared statements, and closes
// the handle if Open created it. Writes after Close fail as not applied.
func (d *Driver) Close() error {
	d.wc.close()
	d.readsMu.Lock()
	for _, st := range d.reads {
		_ = st.Close()
	}
	d.reads = nil
	d.readsMu.Unlock()
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

var _ driver.DurabilityChecker = (*Driver)(nil)

func (d *Driver) Provision(ctx context.Context, resource string) error {
	return d.exec(ctx, func(ctx context.Context, conn querier) error {
		_, err := conn.ExecContext(ctx, d.q(sqlProvision), resource)
		return err
	})
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	var (
		epoch, gen, until int64
		ok                bool
	)
	err := d.execOK(ctx, &ok, func(ctx context.Context, conn querier) (err error) {
		ok, err = queryOne(ctx, conn, d.q(sqlAcquire), []any{resource, owner, ttl.Microseconds()}, &epoch, &gen, &until)
		return err
	})
	if err != nil {
		return driver.Grant{}, err // exec classified it
	}
	if !ok {
		// Refused; reading the row only explains why. It is embedded, so this costs microseconds.
		// The refusal is certain (the transaction committed and the statement returned no row),
		// so a read that fails, for instance because ctx ended meanwhile, leaves it not applied:
		// never an unknown outcome.
		st, err := d.Read(ctx, resource)
		if errors.Is(err, driver.ErrNotFound) {
			return driver.Grant{}, err
		}
		if err != nil {
			return driver.Grant{}, driver.NotApplied(fmt.Errorf("acquisition refused; reading the lease that refused it: %w", err))
		}
		return driver.Grant{}, &driver.BusyError{Epoch: st.Epoch, Generation: st.Generation, LeaseUntil: st.LeaseUntil}
	}
	return driver.Grant{Epoch: epoch, Generation: gen, LeaseUntil: fromMicros(until)}, nil
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	var (
		until int64
		ok    bool
	)
	err := d.execOK(ctx, &ok, func(ctx context.Context, conn querier) (err error) {
		ok, err = queryOne(ctx, conn, d.q(sqlRenew), []any{l.Resource, l.Owner, l.Generation, l.Epoch, ttl.Microseconds()}, &until)
		return err
	})
	if !ok || err != nil {
		return time.Time{}, false, err
	}
	return fromMicros(until), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, sqlPublish, l, pub)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, sqlPublishAndRelease, l, pub)
}

// publish runs the conditional UPDATE and records the operation id as accepted, in one
// operation of the group: both happen or neither does (group.go).
func (d *Driver) publish(ctx context.Context, query string, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	args := []any{l.Resource, l.Owner, l.Generation, l.Epoch, nonNil(pub.Payload), pub.SourceVersion, pub.OpID}
	var ok bool
	err := d.execOK(ctx, &ok, func(ctx context.Context, conn querier) error {
		ok = false
		res, err := conn.ExecContext(ctx, d.q(query), args...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil || n != 1 {
			return err
		}
		if _, err := conn.ExecContext(ctx, d.q(sqlRecordAccepted), args...); err != nil {
			return err
		}
		ok = true
		return nil
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	var ok bool
	err := d.execOK(ctx, &ok, func(ctx context.Context, conn querier) (err error) {
		ok, err = execOne(ctx, conn, d.q(sqlRelease), l.Resource, l.Owner, l.Generation, l.Epoch)
		return err
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	var (
		st                 = driver.State{Resource: resource}
		owner              sql.NullString
		until, publishedAt sql.NullInt64
		now                int64
	)
	err := d.queryRow(ctx, d.q(sqlRead), resource).Scan(&st.Epoch, &st.Generation, &owner, &until,
		&st.PublishedEpoch, &st.PublishedGeneration, &publishedAt, &st.SourceVersion, &st.PayloadSize,
		&st.CurrentEpoch, &now)
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

// queryRow runs a read through the handle's statement for its text, prepared once (database/sql
// prepares it again on each connection of the pool that runs it, once); when it cannot be
// prepared it runs unprepared and reports its own error.
func (d *Driver) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	d.readsMu.Lock()
	st, ok := d.reads[query]
	if !ok && len(d.reads) < maxStmts {
		var err error
		if st, err = d.db.PrepareContext(ctx, query); err == nil {
			if d.reads == nil {
				d.reads = make(map[string]*sql.Stmt)
			}
			d.reads[query] = st
		} else {
			st = nil
		}
	}
	d.readsMu.Unlock()
	if st == nil {
		return d.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	var (
		gen     int64
		payload []byte
	)
	err := d.queryRow(ctx, d.q(sqlReadPayload), resource).Scan(&gen, &payload)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, driver.ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	return payload, gen, nil
}

func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	var (
		op  driver.Operation
		err error
	)
	xerr := d.exec(ctx, func(ctx context.Context, conn querier) error {
		op, err = d.operation(ctx, conn, sqlResolve, opID)
		return err
	})
	if xerr != nil {
		return driver.Operation{OpID: opID}, xerr
	}
	return op, nil
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	return d.operation(ctx, d.db, sqlReadOperation, opID)
}

func (d *Driver) operation(ctx context.Context, db querier, query, opID string) (driver.Operation, error) {
	var (
		op                 = driver.Operation{OpID: opID}
		resource           sql.NullString
		epoch, gen, atUsec sql.NullInt64
	)
	ok, err := queryOne(ctx, db, d.q(query), []any{opID}, &op.Outcome, &resource, &epoch, &gen, &atUsec)
	if err != nil || !ok {
		return driver.Operation{OpID: opID}, err
	}
	op.Resource, op.Epoch, op.Generation = resource.String, epoch.Int64, gen.Int64
	op.RecordedAt = fromMicros(atUsec.Int64)
	return op, nil
}

// BumpEpoch sets the epoch to max(epoch + 1, the clock) and frees every lease, in one
// operation of the group: both happen or neither does (group.go).
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	var epoch int64
	err := d.exec(ctx, func(ctx context.Context, conn querier) error {
		if err := conn.QueryRowContext(ctx, d.q(sqlBumpEpoch)).Scan(&epoch); err != nil {
			return err
		}
		_, err := conn.ExecContext(ctx, d.q(sqlFreeAll))
		return err
	})
	return epoch, err
}

func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	var n int64
	err := d.exec(ctx, func(ctx context.Context, conn querier) error {
		res, err := conn.ExecContext(ctx, d.q(sqlPrune), age.Microseconds())
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// CheckDurability reports settings of the connection that can lose acknowledged commits.
func (d *Driver) CheckDurability(ctx context.Context) ([]string, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var (
		sync    int
		journal string
		out     []string
	)
	if err := conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		return nil, err
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journal); err != nil {
		return nil, err
	}
	if sync < 2 {
		out = append(out, fmt.Sprintf("SQLite synchronous is %d, below FULL (2): a power loss can undo acknowledged commits", sync))
	}
	if j := strings.ToLower(journal); j == "off" || j == "memory" {
		out = append(out, fmt.Sprintf("SQLite journal_mode is %s: a crash can corrupt or undo commits", j))
	}
	return out, nil
}

// classify marks an error after which the statement certainly did not take effect. In an
// embedded engine a failed statement has rolled back, except when writing or syncing the
// commit itself failed (an I/O error, a full disk, corruption): then the outcome is unknown.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return err
		}
		return driver.NotApplied(err)
	}
	return err
}

// querier is a handle, one of its connections, or the writer's connection (writeConn).
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// queryOne runs a statement with RETURNING, reads its result to the end and checks every error
// before trusting the row: ok is true only when exactly one row came back.
func queryOne(ctx context.Context, db querier, query string, args []any, dest ...any) (bool, error) {
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
func execOne(ctx context.Context, db querier, query string, args ...any) (bool, error) {
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
