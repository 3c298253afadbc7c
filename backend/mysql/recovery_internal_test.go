package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced/driver"
)

func migrated(t *testing.T) *Driver {
	t.Helper()
	d, err := Open(CreateTestDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitBlockedBy returns once some transaction waits for a lock held by tx, as the server
// reports it: the barrier that orders the two sides, instead of a sleep. InnoDB refreshes its
// information_schema lock tables only when they have not been read for 100 ms, hence the
// polling interval.
func waitBlockedBy(t *testing.T, db *sql.DB, tx *sql.Tx, done <-chan struct{}) {
	t.Helper()
	var id int64
	if err := tx.QueryRowContext(ctxFor(t), `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			t.Fatal("the other side finished without waiting for the lock")
		case <-tick.C:
		}
		var n int
		if err := QueryInnoDBTrx(ctxFor(t), db, `SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w
JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
WHERE b.trx_mysql_thread_id = ?`, []any{id}, &n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
}

// TestAcquireDuringEpochBump: an acquisition that starts while a bump holds the epoch row waits
// for the bump to commit and installs the new epoch, never the old one after the bump freed
// every lease. The bump is fenced_bump_epoch's own two statements, held open between them.
func TestAcquireDuringEpochBump(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	if err := d.Provision(ctxFor(t), "r"); err != nil {
		t.Fatal(err)
	}
	tx, err := d.db.BeginTx(ctxFor(t), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var before, bumped int64
	if err := d.db.QueryRowContext(ctxFor(t), `SELECT epoch FROM fenced_meta`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctxFor(t), sqlBumpEpoch.first.sql); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctxFor(t), `SELECT epoch FROM fenced_meta`).Scan(&bumped); err != nil || bumped <= before {
		t.Fatalf("the bump set epoch %d after %d: %v", bumped, before, err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g, err := d.Acquire(context.Background(), "r", "owner", time.Minute)
		got <- result{g, err}
	}()
	waitBlockedBy(t, d.db, tx, done)
	if _, err := tx.ExecContext(ctxFor(t), sqlBumpEpoch.second.sql); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.g.Epoch != bumped || r.g.Generation != 1 {
		t.Fatalf("acquire during the bump: %+v, %v; want epoch %d, generation 1", r.g, r.err, bumped)
	}
	st, err := d.Read(ctxFor(t), "r")
	if err != nil || st.Epoch != bumped || st.CurrentEpoch != bumped || st.Owner != "owner" {
		t.Fatalf("row after the bump: %+v, %v", st, err)
	}
}

// TestPublishRacingResolve: a Resolve of the same id whose record is written but not yet
// committed makes the publication wait on the key; when it commits, the publication is
// refused and rolled back whole, and the outcome stays aborted.
func TestPublishRacingResolve(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	if err := d.Provision(ctxFor(t), "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctxFor(t), "r", "owner", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.db.BeginTx(ctxFor(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctxFor(t), sqlResolve.sql, (&params{opID: "op"}).values(sqlResolve.args)...); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ok  bool
		err error
	}
	got := make(chan result, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ok, err := d.Publish(context.Background(),
			driver.LeaseRef{Resource: "r", Owner: "owner", Epoch: g.Epoch, Generation: g.Generation},
			driver.Publication{Payload: []byte("late"), OpID: "op"})
		got <- result{ok, err}
	}()
	waitBlockedBy(t, d.db, tx, done)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.ok || r.err != nil {
		t.Fatalf("publication racing a resolve: ok %t, %v; want refused", r.ok, r.err)
	}
	st, err := d.Read(ctxFor(t), "r")
	if err != nil || st.PublishedGeneration != 0 || st.PayloadSize != 0 {
		t.Fatalf("the refused publication changed the row: %+v, %v", st, err)
	}
	if op, err := d.ResolveOperation(ctxFor(t), "op"); err != nil || op.Outcome != driver.OutcomeAborted {
		t.Fatalf("resolve: %+v, %v", op, err)
	}
}

// TestCheckDurability compares the warnings with the server's own settings (which the test
// does not change: they are global and shared), then moves one table off InnoDB.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	var s durabilitySettings
	if err := d.db.QueryRowContext(ctxFor(t), `SELECT @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog`).
		Scan(&s.flushLogAtTrxCommit, &s.logBin, &s.syncBinlog); err != nil {
		t.Fatal(err)
	}
	want := s.warnings()
	got, err := d.CheckDurability(ctxFor(t))
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("warnings %q, %v; the server's settings (%+v) give %q", got, err, s, want)
	}
	if _, err := d.db.ExecContext(ctxFor(t), `ALTER TABLE fenced_operations ENGINE = MyISAM`); err != nil {
		t.Fatal(err)
	}
	got, err = d.CheckDurability(ctxFor(t))
	if err != nil || len(got) != len(want)+1 || !slices.ContainsFunc(got, func(w string) bool {
		return w == "table fenced_operations uses the MyISAM engine, not InnoDB: its writes are not transactional or crash-safe"
	}) {
		t.Fatalf("warnings after moving fenced_operations to MyISAM: %q, %v", got, err)
	}
}

func TestDurabilityWarnings(t *testing.T) {
	t.Parallel()
	innodb := map[string]string{"fenced_resources": "InnoDB", "fenced_meta": "InnoDB", "fenced_operations": "InnoDB"}
	for _, c := range []struct {
		s    durabilitySettings
		want int
	}{
		{durabilitySettings{1, 0, 0, innodb}, 0},
		{durabilitySettings{1, 1, 1, innodb}, 0},
		{durabilitySettings{2, 0, 0, innodb}, 1},
		{durabilitySettings{0, 1, 0, innodb}, 2},
		{durabilitySettings{1, 1, 100, innodb}, 1},
		{durabilitySettings{1, 0, 0, map[string]string{"fenced_resources": "Aria", "fenced_meta": "InnoDB"}}, 1},
	} {
		if got := c.s.warnings(); len(got) != c.want {
			t.Errorf("%+v: %q, want %d warnings", c.s, got, c.want)
		}
	}
}

// TestClassify: only errors that prove the statement did not take effect are "not applied".
func TestClassify(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, c := range []struct {
		err        error
		notApplied bool
	}{
		{&mysql.MySQLError{Number: erLockDeadlock}, true},
		{&mysql.MySQLError{Number: erLockWaitTimeout}, true},
		{&mysql.MySQLError{Number: erDupEntry}, true},
		{&mysql.MySQLError{Number: 1370}, true}, // execute denied
		{fmt.Errorf("call: %w", &mysql.MySQLError{Number: erErrorDuringCommit}), false},
		{&mysql.MySQLError{Number: 1317}, false}, // KILL QUERY, perhaps after the CALL's commit
		{&mysql.MySQLError{Number: 1969}, false}, // max_statement_time
		{&mysql.MySQLError{Number: 1927}, false}, // KILL CONNECTION
		{sqldriver.ErrBadConn, true},
		{dial, true},
		{connectError{"127.0.0.1:3306", mysql.ErrInvalidConn}, true},
		{&mysql.MySQLError{Number: erOptionPreventsStatement, Message: "The MariaDB server is running with the --read-only option so it cannot execute this statement"}, true},
		{mysql.ErrInvalidConn, false},
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: errors.New("reset")}, false},
	} {
		if got := errors.Is(classify(c.err), driver.ErrNotApplied); got != c.notApplied {
			t.Errorf("classify(%v): not applied %t, want %t", c.err, got, c.notApplied)
		}
	}
}

// TestStatementsAndProcedures: each statement's placeholders and its procedure's parameters
// name the same values, and the text sent directly is the procedure's body.
func TestStatementsAndProcedures(t *testing.T) {
	t.Parallel()
	for _, s := range procedureStmts {
		for _, part := range []*stmt{s, s.first, s.second} {
			if part == nil || part.kind == kindTx {
				continue
			}
			for _, name := range part.args {
				if _, ok := paramTypes[name]; !ok {
					t.Errorf("%s names %s, which has no procedure type", s.name, name)
				}
			}
		}
		if s.kind != kindTx && len(s.args) != countPlaceholders(s.sql) {
			t.Errorf("%s: %d arguments for %d placeholders", s.name, len(s.args), countPlaceholders(s.sql))
		}
	}
}

func countPlaceholders(sql string) int {
	n := 0
	for _, c := range sql {
		if c == '?' {
			n++
		}
	}
	return n
}

// killedAfter redefines s's procedure to wait after the first line that is after, runs call,
// and once the server shows the CALL waiting there kills its query (KILL QUERY), which ends
// it with error 1317. It returns call's error.
func killedAfter(t *testing.T, d *Driver, s *stmt, after string, call func() error) error {
	t.Helper()
	ctx := ctxFor(t)
	slow := procedure(s)
	if !strings.Contains(slow, after) {
		t.Fatalf("fenced_%s has no %q:\n%s", s.name, after, slow)
	}
	// SLEEP() alone in a statement swallows the kill and returns 1; inside a query it does not.
	slow = strings.Replace(slow, after, after+"SELECT COUNT(*) INTO @slept FROM fenced_meta WHERE SLEEP(600) = 0;\n", 1)
	for _, q := range []string{"DROP PROCEDURE IF EXISTS fenced_" + s.name, slow} {
		if _, err := d.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- call() }()
	// The barrier: the server reports the CALL in the sleep.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var id int64
	for id == 0 {
		select {
		case err := <-done:
			t.Fatalf("fenced_%s ended before it was killed: %v", s.name, err)
		case <-tick.C:
		}
		err := d.db.QueryRowContext(ctx, `SELECT ID FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND STATE = 'User sleep'`).Scan(&id)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
	}
	if _, err := d.db.ExecContext(ctx, fmt.Sprintf("KILL QUERY %d", id)); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// TestKilledAfterCommitIsUnknown: a KILL QUERY that ends a procedure after its write committed
// is an unknown outcome, not "not applied", and the write is there. fenced_renew's UPDATE
// autocommits, and the kill arrives before it selects what it returns (its handler passes the
// kill on as 1317); fenced_publish's handler turns a kill after COMMIT into 1180.
func TestKilledAfterCommitIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	d := migrated(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ref := driver.LeaseRef{Resource: "r", Owner: "o", Epoch: g.Epoch, Generation: g.Generation}

	d.mode.Store(modeProcedures) // as a granted role does: call fenced_renew
	err = killedAfter(t, d, sqlRenew, sqlRenew.body+";\n", func() error {
		_, _, err := d.Renew(ctx, ref, time.Hour)
		return err
	})
	d.mode.Store(modeDirect)
	if serverError(err) != erQueryInterrupted || errors.Is(err, driver.ErrNotApplied) {
		t.Errorf("renewal killed after its UPDATE: %v, want error %d with an unknown outcome", err, erQueryInterrupted)
	}
	st, err := d.Read(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if left := st.LeaseUntil.Sub(st.Now); left < 30*time.Minute {
		t.Errorf("the killed renewal's lease has %s left, want about an hour: the test killed it before its UPDATE", left)
	}

	err = killedAfter(t, d, sqlPublish, "COMMIT;\n", func() error {
		_, err := d.Publish(ctx, ref, driver.Publication{Payload: []byte("p"), OpID: "killed"})
		return err
	})
	if err == nil || errors.Is(err, driver.ErrNotApplied) {
		t.Errorf("publication killed after its commit: %v, want an unknown outcome", err)
	}
	op, err := d.ReadOperation(ctx, "killed")
	if err != nil || op.Outcome != driver.OutcomeAccepted {
		t.Errorf("the killed publication's id reads %+v (%v), want accepted", op, err)
	}
}
