package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
)

// TestGate runs the destination suite and the gate's tests on MariaDB/MySQL: the gate package
// lives in the core module, which has no MySQL driver.
func TestGate(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, gateEngine)
}

var gateEngine = gatetest.Engine{Dialect: gate.MySQL, Open: func(t testing.TB) *sql.DB {
	d, err := Open(CreateTestDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.DB()
}}

// TestGateBatched runs them again with Gate.Exec sending the write and the check as one
// multi-statement batch (Config.MySQLMultiStatements).
func TestGateBatched(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, batchedEngine)
}

// batchedEngine's database allows multi-statement batches; interpolateParams is on by default
// in this package's URLs.
var batchedEngine = gatetest.Engine{Dialect: gate.MySQL, Config: &gate.Config{MySQLMultiStatements: true},
	Open: func(t testing.TB) *sql.DB {
		d, err := Open(CreateTestDatabase(t) + "?multiStatements=true")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d.DB()
	}}

// Without multiStatements in the DSN the batch is refused by the server with an error that
// names the setting, and nothing is written.
func TestGateBatchedNeedsMultiStatements(t *testing.T) {
	t.Parallel()
	e := batchedEngine
	e.Open = gateEngine.Open
	s := gatetest.NewService(t, e)
	ctx := context.Background()
	if err := s.Gate.Add(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	err := s.WriteExec(ctx, "r", gatetest.Tok(1, 1), []byte("x\x00"))
	if err == nil || !strings.Contains(err.Error(), "multiStatements=true") {
		t.Fatalf("a batch without multiStatements: %v", err)
	}
	if m, err := s.Gate.Mark(ctx, "r"); err != nil || m != (fenced.Token{}) {
		t.Fatalf("mark %s (%v) after a refused batch", m, err)
	}
}

// TestGateCheckWaitsForTheRaise: on InnoDB too, a check waiting on an uncommitted raise's row
// lock is decided on the committed mark. The plain-read mutant accepts the superseded
// holder's token 1.5, equal to the committed mark, while the raise to 1.6 is open.
func TestGateCheckWaitsForTheRaise(t *testing.T) {
	t.Parallel()
	gatetest.CheckWaitsForTheRaise(t, gateEngine, innodbTrxInterval, innodbWaiting(t))
	t.Run("mutant plain read", func(t *testing.T) {
		s := gatetest.NewService(t, gateEngine)
		s.Checker = plainReadCheck{s.Gate}
		err := gatetest.CheckWaitsForTheRaiseOf(context.Background(), s, gatetest.Tok(1, 5), gatetest.Tok(1, 5), destination.ErrStale, innodbTrxInterval, innodbWaiting(t))
		if err == nil || !strings.Contains(err.Error(), "finished while tx1 held the row raised to "+gatetest.Tok(1, 6).String()+": <nil>") {
			t.Fatalf("the plain-read mutant passed: %v", err)
		}
	})
}

// TestGateRaiseWaitsForTheCheck: a raise waits for a transaction that checked the mark's own
// token (InnoDB's exclusive row lock; a second check of that token waits too). The mutant
// that accepts the mark's own token after a plain read, which locks nothing, lets the raise
// commit while the first check's transaction is open.
func TestGateRaiseWaitsForTheCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := gatetest.RaiseWaitsForTheCheck(ctx, gatetest.NewService(t, gateEngine), false, innodbTrxInterval, innodbWaiting(t)); err != nil {
		t.Fatal(err)
	}
	t.Run("candidate share-first", func(t *testing.T) { // gate_candidates_test.go: LOCK IN SHARE MODE
		s := gatetest.NewService(t, gateEngine)
		c, err := newShareFirst(false)(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		s.Checker = c
		if err := gatetest.RaiseWaitsForTheCheck(ctx, s, false, innodbTrxInterval, innodbWaiting(t)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mutant plain read", func(t *testing.T) {
		s := gatetest.NewService(t, gateEngine)
		s.Checker = plainReadCheck{s.Gate}
		err := gatetest.RaiseWaitsForTheCheck(ctx, s, false, innodbTrxInterval, innodbWaiting(t))
		if err == nil || !strings.Contains(err.Error(), "while tx1") {
			t.Fatalf("the plain-read mutant passed: %v", err)
		}
	})
}

// plainReadCheck is the mutant of an equal-token check that reads the mark with a plain SELECT
// (InnoDB's consistent read, without a lock) and accepts the mark's own token on what it read;
// other tokens go to the gate.
type plainReadCheck struct{ *gate.Gate }

func (c plainReadCheck) Check(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token) error {
	var equal bool
	err := tx.QueryRowContext(ctx, "SELECT epoch = ? AND generation = ? FROM "+gate.DefaultTable+" WHERE resource = ?",
		t.Epoch, t.Generation, resource).Scan(&equal)
	if err == nil && equal {
		return nil
	}
	return c.Gate.Check(ctx, tx, resource, t)
}

// MariaDB refreshes its INNODB_TRX cache only when it was not read for 100 ms.
const innodbTrxInterval = 150 * time.Millisecond

// innodbWaiting reports whether tx2's transaction waits on a lock.
func innodbWaiting(t *testing.T) func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool {
	return func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool {
		var id int64
		if err := tx2.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return func() bool {
			var waiting bool
			err := QueryInnoDBTrx(ctx, db, `SELECT COUNT(*) > 0 FROM information_schema.INNODB_TRX
				WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'`, []any{id}, &waiting)
			return err == nil && waiting
		}
	}
}

// BenchmarkGate: a service's write transaction with the gate's check beside the same
// transaction without it, on MariaDB/MySQL.
func BenchmarkGate(b *testing.B) { gatetest.Bench(b, gateEngine) }

// BenchmarkGateBatched: the same, with Exec's write and check in one batch (exec/raw).
func BenchmarkGateBatched(b *testing.B) { gatetest.Bench(b, batchedEngine) }

// TestGateCheckIsPrepared: once the gate has prepared its check (here by Add), Check runs it
// as the server-side prepared statement (COM_STMT_EXECUTE) instead of sending its text to be
// parsed again in every transaction. The counters are the session's, read on the
// transaction's own connection.
func TestGateCheckIsPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := gatetest.NewService(t, gateEngine)
	const res = "report ü prepared"
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // the first check on a connection prepares there, the next ones reuse
		tx, err := s.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		exec := sessionStatus(t, tx, "Com_stmt_execute")
		if err := s.Gate.Check(ctx, tx, res, gatetest.Tok(1, int64(i+1))); err != nil {
			t.Fatal(err)
		}
		if d := sessionStatus(t, tx, "Com_stmt_execute") - exec; d != 1 {
			t.Errorf("check %d: %d prepared statements executed, want 1: the check was sent as text", i, d)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// sessionStatus reads a counter of tx's session.
func sessionStatus(t *testing.T, tx *sql.Tx, name string) int64 {
	t.Helper()
	var n string
	var v int64
	if err := tx.QueryRowContext(context.Background(), "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestGateEqualCheckWritesNothing: a check of the mark's own token updates no row (InnoDB is
// not asked to write, so it logs no undo or redo), where a raise updates one.
func TestGateEqualCheckWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := gatetest.NewService(t, gateEngine)
	const res = "rapport nº 10 ü"
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, c := range []struct {
		token   fenced.Token
		updates int64
	}{{gatetest.Tok(1, 3), 1}, {gatetest.Tok(1, 3), 0}, {gatetest.Tok(1, 3), 0}, {gatetest.Tok(2, 1), 1}} {
		before := sessionStatus(t, tx, "Handler_update")
		if err := s.Gate.Check(ctx, tx, res, c.token); err != nil {
			t.Fatal(err)
		}
		if d := sessionStatus(t, tx, "Handler_update") - before; d != c.updates {
			t.Errorf("check of %s: %d rows updated, want %d", c.token, d, c.updates)
		}
	}
}

// TestGateInsertIDOfAnEarlierStatement: the check reads its decision from the insert id of its
// own OK packet; a LAST_INSERT_ID(1) left in the session by an earlier statement never makes
// the check of an unknown resource or of a stale token accepted, alone or batched.
func TestGateInsertIDOfAnEarlierStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, e := range []gatetest.Engine{gateEngine, batchedEngine} {
		const res = "rapport nº 11"
		s := markedService(t, e, res, gatetest.Tok(1, 5))
		for _, c := range []struct {
			resource string
			token    fenced.Token
			want     error
		}{
			{"no such resource", gatetest.Tok(9, 9), destination.ErrUnknownResource},
			{res, gatetest.Tok(1, 4), destination.ErrStale},
		} {
			for _, batched := range []bool{false, true} {
				tx, err := s.DB.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				var one int64
				if err := tx.QueryRowContext(ctx, "SELECT LAST_INSERT_ID(1)").Scan(&one); err != nil || one != 1 {
					t.Fatalf("LAST_INSERT_ID(1): %d, %v", one, err)
				}
				if batched {
					err = s.Gate.Exec(ctx, tx, c.resource, c.token, "DO 0")
				} else {
					err = s.Gate.Check(ctx, tx, c.resource, c.token)
				}
				if !errors.Is(err, c.want) {
					t.Errorf("%q %s (batched %v): %v, want %v", c.resource, c.token, batched, err, c.want)
				}
				_ = tx.Rollback()
			}
		}
	}
}

// earlierCheck is the check of the former version, for BenchmarkGateEarlier: it counted every
// accepted check in a column of its own so that an equal token changed the row and was
// reported as affected, which made InnoDB log undo and redo on every write. It runs on a copy
// of the gate's table.
type earlierCheck struct {
	stmt  *sql.Stmt
	batch bool
}

const earlierStatement = `UPDATE fenced_gate_earlier SET epoch = ?, generation = ?, checks = checks + 1
	WHERE resource = ? AND (epoch < ? OR (epoch = ? AND generation <= ?))`

func newEarlierCheck(ctx context.Context, s *gatetest.Service, batch bool) (gatetest.Checker, error) {
	for _, q := range []string{
		`CREATE TABLE fenced_gate_earlier (resource VARBINARY(255) NOT NULL PRIMARY KEY,
			epoch BIGINT NOT NULL, generation BIGINT NOT NULL, checks BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB`,
		`INSERT INTO fenced_gate_earlier (resource, epoch, generation) SELECT resource, epoch, generation FROM ` + gate.DefaultTable,
	} {
		if _, err := s.DB.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	stmt, err := s.DB.PrepareContext(ctx, earlierStatement)
	return earlierCheck{stmt: stmt, batch: batch}, err
}

func (c earlierCheck) accepted(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("refused (%d rows, %v)", n, err)
	}
	return nil
}

func (c earlierCheck) Check(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token) error {
	s := tx.StmtContext(ctx, c.stmt)
	defer func() { _ = s.Close() }()
	return c.accepted(s.ExecContext(ctx, t.Epoch, t.Generation, resource, t.Epoch, t.Epoch, t.Generation))
}

func (c earlierCheck) Exec(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token, write string, args ...any) error {
	if !c.batch {
		return checkThenWrite(ctx, c, tx, resource, t, write, args)
	}
	return c.accepted(tx.ExecContext(ctx, write+"; "+earlierStatement, append(args, t.Epoch, t.Generation, resource, t.Epoch, t.Epoch, t.Generation)...))
}

// BenchmarkGateEarlier: the service's transaction with the current check and with the former
// one in the same rounds, one statement at a time and batched. Run with:
// go test -run '^$' -bench 'GateEarlier/.*/earlier' -benchtime 2s -count 3 ./backend/mysql/
func BenchmarkGateEarlier(b *testing.B) {
	b.Run("batched=false", func(b *testing.B) {
		gatetest.BenchAgainst(b, gateEngine, func(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
			return newEarlierCheck(ctx, s, false)
		})
	})
	b.Run("batched=true", func(b *testing.B) {
		gatetest.BenchAgainst(b, batchedEngine, func(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
			return newEarlierCheck(ctx, s, true)
		})
	})
}
