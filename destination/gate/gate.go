// Package gate is a high-water-mark gate for a service that receives writes from fenced
// holders. The service keeps, in its own database, the highest token it has accepted for each
// resource, and checks and raises it with one conditional statement inside the transaction of
// each write (Check), so that the check and the write commit together or not at all: a write
// carrying a token older than the mark is refused and its transaction rolled back.
//
// A Gate is also a fenced.Fencer: a holder that names it in fenced.RunOptions.Fence (or calls
// Lease.Fence) raises the mark right after acquiring, so the previous holder's delayed writes
// are refused before the new holder has written anything. Without that, the gate has the gap
// every high-water mark has: it learns of a new holder only from its first write.
//
// What it protects: the writes that go through Check in the same transaction, for the
// resources that have a mark (Add). Nothing else in the service's database.
//
// PostgreSQL, SQLite and MySQL/MariaDB are supported through database/sql; the caller opens
// the *sql.DB with the driver of its choice (pgx's stdlib, modernc.org/sqlite,
// go-sql-driver/mysql). Tokens compare (epoch, generation) in that order.
package gate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

// Dialect selects the SQL spoken by the service's database.
type Dialect int

const (
	Postgres Dialect = iota + 1
	SQLite
	MySQL // also MariaDB
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	case MySQL:
		return "mysql"
	}
	return fmt.Sprintf("dialect(%d)", int(d))
}

// DefaultTable is Config.Table when it is empty.
const DefaultTable = "fenced_gate"

// Config tunes a Gate. A nil *Config means the defaults.
type Config struct {
	// Table holds the marks, one row per resource. Default DefaultTable. A plain identifier:
	// letters, digits and underscores.
	Table string
	// MySQLMultiStatements makes Exec on MySQL/MariaDB always send the service's write and the
	// check in one round trip, as a batch of two statements. Set it only if db was opened with
	// go-sql-driver/mysql's multiStatements=true and interpolateParams=true (a batch cannot be
	// a server-side prepared statement); the batch is refused otherwise. Default false: the
	// gate finds out once whether db's connections take such a batch (see Exec), and until it
	// knows, or when they do not, Exec is Check, then the write, two round trips.
	MySQLMultiStatements bool
	// MySQLNoBatchDetection turns that finding out off: the gate never sends its probe (a
	// transaction of two batches, rolled back) and Exec on MySQL/MariaDB is always Check, then
	// the write, two round trips, whatever db's connections take. For a service whose DSN has
	// multiStatements=true for other reasons and that wants each of its statements sent alone,
	// or that does not want the probe in its server's log. Default false. It cannot be combined
	// with MySQLMultiStatements.
	MySQLNoBatchDetection bool
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Gate checks tokens against the marks in one table of the service's database. A Gate is safe
// for concurrent use by multiple goroutines.
type Gate struct {
	db    *sql.DB
	d     Dialect
	q     queries
	batch bool // MySQLMultiStatements

	// batchable is what probeBatch found on MySQL without MySQLMultiStatements: batchUnknown
	// until a probe gave an answer, batchProbing while one runs.
	batchable atomic.Int32

	// stmt is the check, prepared once; Check runs it through tx.StmtContext, which reuses
	// the statement already prepared on the transaction's connection: the check is then
	// parsed once per connection rather than once per call (modernc.org/sqlite parses every
	// unprepared statement; MySQL's server parses each interpolated query).
	stmtMu sync.Mutex
	stmt   *sql.Stmt

	// execs caches Exec's statement on PostgreSQL (execKey → string): renumbering the check's
	// parameters after the write's took a few microseconds of CPU in every call, more than the
	// lookup. At most maxExecs entries, so that writes whose text varies do not grow it without
	// bound (the driver's own statement cache would not keep them either).
	execs  sync.Map
	nExecs atomic.Int32
}

const maxExecs = 256

const (
	batchUnknown int32 = iota
	batchProbing
	batchYes
	batchNo
)

// batchSep joins the write and the check in a batch. The newline ends a comment that the
// write's text may end with (-- or #), which would otherwise swallow the check; a block comment
// left open makes the batch a syntax error.
const batchSep = "\n; "

type execKey struct {
	write string
	n     int // the write's arguments
}

// prepare prepares the check once. It is called only outside a transaction (preparing takes
// a connection from the pool, which a caller holding the last one in a transaction would wait
// for forever); until it has succeeded, Check sends the statement's text. A failure (the table
// does not exist yet) is left for the next call and for the check itself to report.
func (g *Gate) prepare(ctx context.Context) {
	g.stmtMu.Lock()
	if g.stmt == nil {
		if s, err := g.db.PrepareContext(ctx, g.q.check); err == nil {
			g.stmt = s
		}
	}
	prepared := g.stmt != nil
	g.stmtMu.Unlock()
	// Only once the check is prepared (its table exists, so a probe that fails is refused
	// as a batch), by one caller at a time, without holding stmtMu: the probe takes a
	// connection from the pool, which a caller in a transaction may hold while it waits for
	// stmtMu in Check.
	if prepared && g.d == MySQL && !g.batch && g.batchable.CompareAndSwap(batchUnknown, batchProbing) {
		ok, err := g.probeBatch(ctx)
		switch {
		case ok:
			g.batchable.Store(batchYes)
		case err != nil && ctx.Err() != nil: // cancelled: no answer, ask again next time
			g.batchable.Store(batchUnknown)
		default:
			g.batchable.Store(batchNo)
		}
	}
}

// probeBatch finds out whether Exec can send the write and the check as one batch on db's
// connections: whether they take a batch with parameters (go-sql-driver/mysql's
// multiStatements and interpolateParams), and whether the result of a batch is its last
// statement's, which Exec reads the check's decision from. It sends, in a transaction it rolls
// back, the two batches a mark of its own would give: one that adds the mark and checks the
// mark's token (the last statement's insert id is 1, the first's 0), and one that checks it
// again and ends with a statement that reports no insert id (the last's is 0, the first's 1).
// The mark is named "", a name Add refuses. Any other answer, an error included, is false:
// Exec then keeps to two round trips, which is always correct.
func (g *Gate) probeBatch(ctx context.Context) (bool, error) {
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	args := g.q.checkArgs("", fenced.Token{})
	for _, b := range []struct {
		query string
		args  []any
		want  int64
	}{
		{g.q.add + batchSep + g.q.check, append([]any{""}, args...), 1},
		{g.q.check + batchSep + "DO 0", args, 0},
	} {
		res, err := tx.ExecContext(ctx, b.query, b.args...)
		if err != nil {
			return false, err
		}
		if id, err := res.LastInsertId(); err != nil || id != b.want {
			return false, err
		}
	}
	return true, nil
}

func (g *Gate) prepared() *sql.Stmt {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	return g.stmt
}

type queries struct {
	create, add, check, mark string
	// answers: the check is a query whose one row says whether it accepted; otherwise it
	// accepted when it affected one row. On PostgreSQL the check is raise (a data-modifying
	// WITH clause named fenced_raise) followed by answer; Exec puts the service's write
	// beside them.
	answers       bool
	raise, answer string
	// byInsertID: the check accepted when it reported an insert id of 1 (MySQL).
	byInsertID bool
	// checkArgs orders the statement's arguments: "?" in MySQL is positional.
	checkArgs func(resource string, t fenced.Token) []any
}

// New returns a gate on db. It does not touch the database; call Migrate once.
func New(db *sql.DB, d Dialect, cfg *Config) (*Gate, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if !identifier.MatchString(c.Table) {
		return nil, fmt.Errorf("gate: invalid table name %q: want letters, digits and underscores", c.Table)
	}
	if db == nil {
		return nil, errors.New("gate: nil *sql.DB")
	}
	q, err := statements(d, c.Table)
	if err != nil {
		return nil, err
	}
	if c.MySQLMultiStatements && d != MySQL {
		return nil, fmt.Errorf("gate: MySQLMultiStatements is for the MySQL dialect, not %s", d)
	}
	if c.MySQLNoBatchDetection && d != MySQL {
		return nil, fmt.Errorf("gate: MySQLNoBatchDetection is for the MySQL dialect, not %s", d)
	}
	if c.MySQLNoBatchDetection && c.MySQLMultiStatements {
		return nil, errors.New("gate: MySQLNoBatchDetection and MySQLMultiStatements contradict each other: choose one")
	}
	g := &Gate{db: db, d: d, q: q, batch: c.MySQLMultiStatements}
	if c.MySQLNoBatchDetection {
		g.batchable.Store(batchNo) // as if a probe had said no: prepare never probes
	}
	return g, nil
}

// Migrate creates the marks table if it does not exist.
func (g *Gate) Migrate(ctx context.Context) error {
	if _, err := g.db.ExecContext(ctx, g.q.create); err != nil {
		return fmt.Errorf("gate: create table: %w", err)
	}
	g.prepare(ctx)
	return nil
}

// Add gives resource a mark of 0.0 if it has none; an existing mark is kept. Only resources
// with a mark are accepted by Check and Fence: a write naming another resource is refused
// with destination.ErrUnknownResource, so that a typo cannot create an unprotected resource.
func (g *Gate) Add(ctx context.Context, resource string) error {
	if err := fenced.ValidateResource(resource); err != nil {
		return fmt.Errorf("gate: %w", err)
	}
	if _, err := g.db.ExecContext(ctx, g.q.add, resource); err != nil {
		return fmt.Errorf("gate: add %q: %w", resource, err)
	}
	g.prepare(ctx)
	return nil
}

// Mark returns the resource's current mark, or an error matching destination.ErrUnknownResource.
func (g *Gate) Mark(ctx context.Context, resource string) (fenced.Token, error) {
	g.prepare(ctx)
	t, found, err := g.read(ctx, g.db, resource)
	switch {
	case err != nil:
		return fenced.Token{}, fmt.Errorf("gate: read the mark of %q: %w", resource, err)
	case !found:
		return fenced.Token{}, fmt.Errorf("gate: %q: %w", resource, destination.ErrUnknownResource)
	}
	return t, nil
}

// execer is what *sql.DB, *sql.Tx and *sql.Conn share.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Check accepts token for resource inside the service's transaction tx, raising the mark to
// token if it is newer; the caller then makes its write in tx and commits. The check and the
// raise are one conditional statement, and the mark cannot be raised by another transaction
// until tx ends: in PostgreSQL and MySQL the row stays locked (on PostgreSQL a token equal to
// the mark takes a share lock, so writes under one token are checked side by side, and a raise
// waits for all of them), in SQLite tx holds the database's write lock. A check that waits for
// an uncommitted raise is decided on the raised mark once that commits. A token older than the
// mark is refused with *destination.StaleError (ErrStale), an unmarked resource with
// ErrUnknownResource; either way nothing was changed and the caller must roll tx back. A token
// equal to the mark is accepted without writing the mark's row: a holder writes many times
// under one token. On MySQL the check sets the session's LAST_INSERT_ID() to 1 or 0.
//
// The check runs as a statement prepared once per connection as soon as the gate has run
// anything outside a transaction (Migrate, Add, Mark, Fence, Do); before that, as text.
func (g *Gate) Check(ctx context.Context, tx *sql.Tx, resource string, token fenced.Token) error {
	if s := g.prepared(); s != nil {
		return g.check(ctx, txStmt{tx: tx, s: s, query: g.q.check}, resource, token)
	}
	return g.check(ctx, tx, resource, token)
}

// txStmt runs the prepared check in tx; every other statement (the reading of the mark
// after a refusal) goes to tx as text.
type txStmt struct {
	tx    *sql.Tx
	s     *sql.Stmt
	query string // s's
}

func (t txStmt) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if query != t.query {
		return t.tx.ExecContext(ctx, query, args...)
	}
	s := t.tx.StmtContext(ctx, t.s)
	defer func() { _ = s.Close() }() // the transaction's handle only; the connection keeps the statement
	return s.ExecContext(ctx, args...)
}

func (t txStmt) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if query != t.query {
		return t.tx.QueryRowContext(ctx, query, args...)
	}
	// Closing the transaction's handle leaves the row readable: the statement it derives
	// from stays open on the connection.
	s := t.tx.StmtContext(ctx, t.s)
	defer func() { _ = s.Close() }()
	return s.QueryRowContext(ctx, args...)
}

func (g *Gate) check(ctx context.Context, ex execer, resource string, token fenced.Token) error {
	return g.checkAfter(ctx, ex, resource, token, "", nil)
}

// checkAfter runs the check, preceded in the same batch by the statement before (with its
// args) if there is one: the result (affected rows, insert id) is then the last statement's, the
// check's (go-sql-driver/mysql).
func (g *Gate) checkAfter(ctx context.Context, ex execer, resource string, token fenced.Token, before string, args []any) error {
	if err := destination.CheckToken(token); err != nil {
		return fmt.Errorf("gate: %q: %w", resource, err)
	}
	query, what := g.q.check, "check"
	if before != "" {
		// A semicolon that ends the write would leave an empty statement before the check.
		before = strings.TrimRight(before, "; \t\r\n")
		query, what = before+batchSep+query, "write and check in one batch (does the DSN have multiStatements=true and interpolateParams=true?)"
	}
	accepted, err := g.accepted(ctx, ex, query, append(args, g.q.checkArgs(resource, token)...))
	if err != nil {
		return fmt.Errorf("gate: %s %q: %w", what, resource, err)
	}
	if accepted {
		return nil
	}
	return g.refused(ctx, ex, resource, token)
}

// accepted runs a check and reads its answer: the query's boolean (PostgreSQL), the insert id
// (MySQL) or one affected row (SQLite).
func (g *Gate) accepted(ctx context.Context, ex execer, query string, args []any) (bool, error) {
	if g.q.answers {
		var ok bool
		err := ex.QueryRowContext(ctx, query, args...).Scan(&ok)
		return ok, err
	}
	res, err := ex.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	if g.q.byInsertID {
		id, err := res.LastInsertId()
		return id == 1, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Exec checks token for resource and runs the service's write statement in tx, as Check and
// then tx.ExecContext(ctx, write, args...) would, with the same guarantee. On PostgreSQL the
// two are one statement: write runs as a data-modifying WITH clause beside the check, and the
// statement answers whether the check accepted, so the check costs no round trip of its own.
// write must then be one INSERT, UPDATE or DELETE without a WITH clause of its own or a
// trailing semicolon, its parameters $1 to $n (the gate's follow); the combined statement is
// built once per write text, for up to 256 texts, so write should be a constant. On MySQL,
// write and then the check go as one batch, in one round trip, and the batch's result
// (go-sql-driver reports the last statement's) says whether the check accepted: with
// Config.MySQLMultiStatements always, and otherwise when the gate has found that db's
// connections take such a batch (go-sql-driver/mysql with multiStatements=true and
// interpolateParams=true), which it finds out once, outside a transaction, as soon as it has
// prepared its check (see Check), unless Config.MySQLNoBatchDetection; write is then one
// statement (a semicolon at its end is dropped). Otherwise (SQLite, MySQL until the gate knows,
// when the connections do not take a batch or with MySQLNoBatchDetection) Exec is Check, then
// write: two statements, two round trips.
//
// A refusal is *destination.StaleError (or ErrUnknownResource) as from Check, but the write
// may have run in tx: the caller must roll tx back, as after any error. Exec does not return
// the write's row count.
func (g *Gate) Exec(ctx context.Context, tx *sql.Tx, resource string, token fenced.Token, write string, args ...any) error {
	if g.batch || g.batchable.Load() == batchYes {
		return g.checkAfter(ctx, tx, resource, token, write, args)
	}
	if g.d != Postgres {
		if err := g.Check(ctx, tx, resource, token); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, write, args...); err != nil {
			return fmt.Errorf("gate: write %q: %w", resource, err)
		}
		return nil
	}
	if err := destination.CheckToken(token); err != nil {
		return fmt.Errorf("gate: %q: %w", resource, err)
	}
	accepted, err := g.accepted(ctx, tx, g.execQuery(write, len(args)), append(args, g.q.checkArgs(resource, token)...))
	if err != nil {
		return fmt.Errorf("gate: check and write %q: %w", resource, err)
	}
	if accepted {
		return nil
	}
	return g.refused(ctx, tx, resource, token)
}

// execQuery returns Exec's statement on PostgreSQL for write with n arguments: write as a
// data-modifying WITH clause beside the check, whose parameters follow write's.
func (g *Gate) execQuery(write string, n int) string {
	k := execKey{write, n}
	if q, ok := g.execs.Load(k); ok {
		return q.(string)
	}
	renumber := strings.NewReplacer("$1", fmt.Sprintf("$%d", n+1), "$2", fmt.Sprintf("$%d", n+2), "$3", fmt.Sprintf("$%d", n+3))
	query := "WITH fenced_write AS (" + write + "), fenced_raise AS (" + renumber.Replace(g.q.raise) + ") " + renumber.Replace(g.q.answer)
	if g.nExecs.Load() < maxExecs { // racing stores may pass the bound by the number of goroutines
		if _, loaded := g.execs.LoadOrStore(k, query); !loaded {
			g.nExecs.Add(1)
		}
	}
	return query
}

// refused reads the row of a refused check, only to say why: the statement alone decided,
// and a transaction is still usable, since the statement succeeded.
func (g *Gate) refused(ctx context.Context, ex execer, resource string, token fenced.Token) error {
	cur, found, err := g.read(ctx, ex, resource)
	switch {
	case err != nil:
		return &destination.StaleError{Resource: resource, Token: token} // certainly refused
	case !found:
		return fmt.Errorf("gate: %q: %w", resource, destination.ErrUnknownResource)
	}
	return &destination.StaleError{Resource: resource, Token: token, Current: cur}
}

func (g *Gate) read(ctx context.Context, ex execer, resource string) (fenced.Token, bool, error) {
	var t fenced.Token
	err := ex.QueryRowContext(ctx, g.q.mark, resource).Scan(&t.Epoch, &t.Generation)
	if errors.Is(err, sql.ErrNoRows) {
		return t, false, nil
	}
	return t, err == nil, err
}

// Fence raises resource's mark to token in a statement of its own, so that writes with older
// tokens are refused from now on. It implements fenced.Fencer.
func (g *Gate) Fence(ctx context.Context, resource string, token fenced.Token) error {
	g.prepare(ctx)
	return g.check(ctx, g.db, resource, token)
}

// Do runs fn in a transaction that first checks token for resource, and commits both
// together. An error from Check or fn rolls everything back and is returned. A panic in fn
// rolls back too before it goes on (net/http recovers a handler's panic and carries on), so
// that the transaction does not keep the mark locked and the successor's Fence waiting.
// A failed COMMIT is a *fenced.OutcomeUnknownError (fenced.ErrOutcomeUnknown): its reply may
// have been lost after the database committed, so the write and the raise may or may not
// have taken effect.
func (g *Gate) Do(ctx context.Context, resource string, token fenced.Token, fn func(*sql.Tx) error) error {
	g.prepare(ctx)
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("gate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // sql.ErrTxDone after a commit, ignored
	if err := g.Check(ctx, tx, resource, token); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return &fenced.OutcomeUnknownError{Op: "gate: commit", Resource: resource, Err: err}
	}
	return nil
}
