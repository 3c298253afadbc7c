package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/tlsfiles"
)

// Session kinds, found out once per driver (see the package doc).
const (
	modeUnknown = iota
	modeDirect
	modeProcedures
)

// Server error numbers that change what an error means.
const (
	erDupEntry            = 1062
	erTableAccessDenied   = 1142
	erNoSuchTable         = 1146
	erLockWaitTimeout     = 1205
	erLockDeadlock        = 1213
	erErrorDuringRollback = 1181

	// A statement ended from outside: KILL QUERY (ER_QUERY_INTERRUPTED), MariaDB's
	// max_statement_time (ER_STATEMENT_TIMEOUT), KILL CONNECTION (ER_CONNECTION_KILLED).
	erQueryInterrupted = 1317
	erStatementTimeout = 1969
	erConnectionKilled = 1927

	// A read-only server: read_only=ON for a user without SUPER (1290, which other options
	// raise too, hence the check of its message), a READ ONLY transaction (1792), and MariaDB's
	// innodb_read_only (1836).
	erOptionPreventsStatement = 1290
	erReadOnlyTransaction     = 1792
	erReadOnlyMode            = 1836
)

// isReadOnly reports whether err is the server's refusal to write because it is read-only.
func isReadOnly(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case erReadOnlyTransaction, erReadOnlyMode:
		return true
	case erOptionPreventsStatement:
		return strings.Contains(me.Message, "read-only") || strings.Contains(me.Message, "read_only")
	}
	return false
}

// sqlProbeRead asks whether this session may read fenced_resources, where a write cannot be
// tried: on a read-only server.
const sqlProbeRead = `SELECT 1 FROM fenced_resources WHERE FALSE`

// sqlProbeWrite asks the server whether this session may write fenced_resources. It matches no
// row and takes no row lock; only the privilege check answers.
const sqlProbeWrite = `UPDATE fenced_resources SET generation = generation WHERE FALSE`

// detect finds out whether this session must call the procedures. known is false when the
// tables do not exist yet (Migrate is about to create them).
func (d *Driver) detect(ctx context.Context) (procs, known bool, err error) {
	switch d.mode.Load() {
	case modeDirect:
		return false, true, nil
	case modeProcedures:
		return true, true, nil
	}
	_, err = d.db.ExecContext(ctx, sqlProbeWrite)
	if isReadOnly(err) {
		// No write can tell; a read can, for now. The answer is not kept: once the server
		// accepts writes (a promoted replica), the write probe decides.
		_, err = d.db.ExecContext(ctx, sqlProbeRead)
		switch serverError(err) {
		case 0:
			if err != nil {
				return false, false, err
			}
			return false, true, nil
		case erTableAccessDenied:
			return true, true, nil
		case erNoSuchTable:
			return false, false, nil
		}
	}
	var ce connectError
	if errors.As(err, &ce) {
		return false, false, err
	}
	switch serverError(err) {
	case 0:
		if err != nil {
			return false, false, fmt.Errorf("check table privileges: %w", err)
		}
		d.mode.Store(modeDirect)
		return false, true, nil
	case erTableAccessDenied:
		d.mode.Store(modeProcedures)
		return true, true, nil
	case erNoSuchTable:
		return false, false, nil
	}
	return false, false, fmt.Errorf("check table privileges: %w", err)
}

// procedures reports whether operations must go through the procedures. An error means the
// server could not be asked; the operation was not sent.
func (d *Driver) procedures(ctx context.Context) (bool, error) {
	procs, _, err := d.detect(ctx)
	return procs, err
}

// execer is what a statement runs on: the pool or one pinned connection.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// run executes a statement that writes and returns the rows it matched and the last insert
// id, from the reply of a direct statement or from the row its procedure selects. A kindTx
// statement is always a procedure.
func run(ctx context.Context, e execer, procs bool, s *stmt, p *params) (matched, id int64, err error) {
	matched, id, err = runAs(ctx, e, procs, s, p)
	return matched, id, denied(ctx, e, s, p, err)
}

func runAs(ctx context.Context, e execer, procs bool, s *stmt, p *params) (matched, id int64, err error) {
	if procs || s.kind == kindTx {
		found, err := queryText(ctx, e, s.call(), p.values(s.params), &matched, &id)
		if err == nil && !found {
			err = fmt.Errorf("procedure fenced_%s returned no row", s.name)
		}
		return matched, id, err
	}
	res, err := e.ExecContext(ctx, s.sql, p.values(s.args)...)
	if err != nil {
		return 0, 0, err
	}
	if matched, err = res.RowsAffected(); err != nil {
		return 0, 0, err
	}
	if id, err = res.LastInsertId(); err != nil {
		return 0, 0, err
	}
	return matched, id, nil
}

// query runs a read and scans its first row into dest; found is false when it had none.
func query(ctx context.Context, e execer, procs bool, s *stmt, p *params, dest ...any) (found bool, err error) {
	if procs {
		found, err = queryText(ctx, e, s.call(), p.values(s.params), dest...)
	} else {
		found, err = queryText(ctx, e, s.sql, p.values(s.args), dest...)
	}
	return found, denied(ctx, e, s, p, err)
}

// queryText reads a result to its end, and every result set after it (a CALL sends one more),
// checking every error before trusting the row.
func queryText(ctx context.Context, e execer, text string, args []any, dest ...any) (bool, error) {
	rows, err := e.QueryContext(ctx, text, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		if !found {
			if err := rows.Scan(dest...); err != nil {
				return false, err
			}
			found = true
		}
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	for rows.NextResultSet() {
		for rows.Next() {
		}
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	if err := rows.Close(); err != nil {
		return false, err
	}
	return found, nil
}

// retryAttempts bounds how often one mutation is sent when the server rolled it back as a
// deadlock victim, or go-sql-driver found the connection broken before writing anything: in
// both cases it certainly did not apply, so sending it again cannot apply it twice.
const retryAttempts = 3

func retryable(err error, ctx context.Context) bool {
	return ctx.Err() == nil && (serverError(err) == erLockDeadlock || errors.Is(err, sqldriver.ErrBadConn))
}

// mutate runs one mutation of the protocol and classifies its error.
func (d *Driver) mutate(ctx context.Context, s *stmt, p *params) (matched, id int64, err error) {
	procs, err := d.procedures(ctx)
	if err != nil {
		return 0, 0, driver.NotApplied(err) // the mutation itself was not sent
	}
	for attempt := 1; ; attempt++ {
		matched, id, err = run(ctx, d.db, procs, s, p)
		if err != nil && attempt < retryAttempts && retryable(err, ctx) {
			continue
		}
		return matched, id, classify(err)
	}
}

// oneRow reports whether a lease statement matched its row.
func oneRow(matched int64) (bool, error) {
	if matched > 1 {
		return false, fmt.Errorf("statement matched %d rows; the resource key is not unique", matched)
	}
	return matched == 1, nil
}

func serverError(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// classify is the one place where the error of a mutation gets its meaning: driver.NotApplied
// when the mutation certainly did not take effect, the error itself (an unknown outcome)
// otherwise.
//
//   - A connection that could not be made carried nothing.
//   - driver.ErrBadConn: go-sql-driver returns it only when it wrote nothing (a pooled
//     connection found dead before use), which is also why database/sql may retry it.
//   - A server error reply to an autocommit statement: InnoDB rolled the statement, which is
//     the whole transaction, back. That includes a deadlock (retried by mutate) and a lock wait
//     timeout (with innodb_rollback_on_timeout off the statement is rolled back; on, the
//     transaction, which is the same thing here). A procedure's transaction rolls back on any
//     error before its COMMIT that its handler catches; an error from the COMMIT itself
//     arrives as ER_ERROR_DURING_COMMIT and stays unknown.
//   - A statement killed or timed out (ER_QUERY_INTERRUPTED, ER_STATEMENT_TIMEOUT,
//     ER_CONNECTION_KILLED) stays unknown: it can end a CALL after the procedure's write
//     committed, while it selects what it returns, and the procedure's handler then passes it
//     on as it is (TestKilledAfterCommitIsUnknown).
//   - Anything else (mysql.ErrInvalidConn, an I/O error, a cancelled context while the
//     statement was on its way or running) may have followed the commit.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ce connectError
	var ne *net.OpError
	switch n := serverError(err); {
	case errors.As(err, &ce), errors.As(err, &ne) && ne.Op == "dial", errors.Is(err, sqldriver.ErrBadConn):
		return driver.NotApplied(err)
	case isReadOnly(err):
		return driver.ReadOnly(err)
	case n == erErrorDuringCommit || n == erErrorDuringRollback,
		n == erQueryInterrupted || n == erStatementTimeout || n == erConnectionKilled:
		return err
	case n == erLockDeadlock:
		return driver.NotApplied(fmt.Errorf("chosen as a deadlock victim: %w", err))
	case n == erLockWaitTimeout:
		return driver.NotApplied(fmt.Errorf("lock wait timeout: %w", err))
	case n != 0:
		return driver.NotApplied(err)
	}
	return err
}

// connectErrors marks every error of making a connection (dialing, the handshake,
// authentication): no statement had been written on it.
type connectErrors struct {
	sqldriver.Connector
	addr string
}

func (c connectErrors) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, connectError{c.addr, err}
	}
	return conn, nil
}

// connectError says, in the user's terms, which server could not be reached and why.
type connectError struct {
	addr string
	err  error
}

func (e connectError) Error() string {
	var (
		me    *mysql.MySQLError
		errno syscall.Errno
		dns   *net.DNSError
	)
	cause := e.err.Error()
	switch {
	case errors.As(e.err, &me): // refused by the server: authentication, no such database
		cause = me.Message
	case errors.As(e.err, &dns):
		cause = dns.Error()
	case errors.As(e.err, &errno):
		cause = errno.Error()
	}
	if c, ok := tlsfiles.Cause(e.err, paramTLSCA); ok {
		cause = c
	}
	return fmt.Sprintf("cannot connect to the MySQL or MariaDB server at %s: %s", e.addr, cause)
}

func (e connectError) Unwrap() error { return e.err }
