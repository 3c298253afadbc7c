package sqlserver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"testing"
)

// recorder is a database/sql driver that RECORDS each statement's text and arguments and
// answers from a script. It is a recording stub for checking what the SQL Server driver sends
// and how it reads replies, nothing more: it evaluates no SQL, so it is never used to test
// concurrency or the protocol's behavior, which only a real SQL Server can show
// (sqlserver_test.go runs the conformance suite against one).
type recorder struct {
	mu         sync.Mutex
	calls      []call
	replies    []reply
	connectErr error // returned by Connect instead of a connection, when set
	checkErr   error // returned by CheckNamedValue, when set (database/sql's argument errors)
	connects   int   // connections made
	closes     int   // connections closed
}

// call is one statement as database/sql handed it to the driver.
type call struct {
	kind  string // "query", "exec", "begin", "commit" or "rollback"
	query string
	args  []driver.NamedValue
}

// reply is the scripted answer to the next query or exec.
type reply struct {
	err      error // returned instead of a result
	affected int64 // rows affected, for exec
	sets     []resultSet
	rowsErr  error // returned by Rows.Next after the last row of the last set
}

type resultSet struct {
	cols []string
	rows [][]driver.Value
}

// newRecorder returns a *sql.DB over a recorder that answers with replies in order.
func newRecorder(t *testing.T, replies ...reply) (*recorder, *sql.DB) {
	r := &recorder{replies: replies}
	db := sql.OpenDB(r)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return r, db
}

func (r *recorder) record(kind, query string, args []driver.NamedValue) reply {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{kind, query, args})
	if kind != "query" && kind != "exec" || len(r.replies) == 0 {
		return reply{}
	}
	next := r.replies[0]
	r.replies = r.replies[1:]
	return next
}

func (r *recorder) Calls() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

func (r *recorder) Connect(context.Context) (driver.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.connectErr != nil {
		return nil, r.connectErr
	}
	r.connects++
	return &recConn{r}, nil
}
func (r *recorder) Driver() driver.Driver { return recDriver{} }

type recDriver struct{}

func (recDriver) Open(string) (driver.Conn, error) { return nil, errors.New("use the connector") }

type recConn struct{ r *recorder }

func (c *recConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("recorder: no Prepare")
}
func (c *recConn) Close() error {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.closes++
	return nil
}

// Counts returns how many connections were made and closed.
func (r *recorder) Counts() (connects, closes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects, r.closes
}
func (c *recConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *recConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	c.r.record("begin", "", nil)
	return recTx{c.r}, nil
}

// CheckNamedValue accepts every argument as it is, so the recorded values keep their Go types
// (an int32 stays an int32, as go-mssqldb would see it).
func (c *recConn) CheckNamedValue(*driver.NamedValue) error {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	return c.r.checkErr
}

func (c *recConn) ExecContext(_ context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	rep := c.r.record("exec", query, args)
	if rep.err != nil {
		return nil, rep.err
	}
	return driver.RowsAffected(rep.affected), nil
}

func (c *recConn) QueryContext(_ context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rep := c.r.record("query", query, args)
	if rep.err != nil {
		return nil, rep.err
	}
	if len(rep.sets) == 0 {
		rep.sets = []resultSet{{cols: []string{"x"}}}
	}
	return &recRows{sets: rep.sets, err: rep.rowsErr}, nil
}

type recTx struct{ r *recorder }

func (t recTx) Commit() error   { t.r.record("commit", "", nil); return nil }
func (t recTx) Rollback() error { t.r.record("rollback", "", nil); return nil }

type recRows struct {
	sets []resultSet
	set  int
	row  int
	err  error
}

func (r *recRows) Columns() []string { return r.sets[r.set].cols }
func (r *recRows) Close() error      { return nil }

func (r *recRows) Next(dest []driver.Value) error {
	s := r.sets[r.set]
	if r.row >= len(s.rows) {
		if r.set == len(r.sets)-1 && r.err != nil {
			return r.err
		}
		return io.EOF
	}
	copy(dest, s.rows[r.row])
	r.row++
	return nil
}

func (r *recRows) HasNextResultSet() bool { return r.set < len(r.sets)-1 }

func (r *recRows) NextResultSet() error {
	if !r.HasNextResultSet() {
		return io.EOF
	}
	r.set++
	r.row = 0
	return nil
}
