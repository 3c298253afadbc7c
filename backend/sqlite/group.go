package sqlite

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"fmt"
	"strings"
	"sync"

	"github.com/fenced-dev/fenced/driver"
)

// Group commit. SQLite admits one writer at a time, and with synchronous=FULL every commit is
// an fsync, so a process whose goroutines write one commit each spends its time waiting for the
// disk. The driver therefore queues its writes, and one writer applies everything queued so far
// in one IMMEDIATE transaction: each operation is still its own conditional statement (or
// statements), evaluated in queue order and seeing the changes of the operations before it,
// and the group costs one commit and one fsync. The writer is the caller that found no writer
// running, for its own group; what queued meanwhile goes to a writer goroutine, which runs
// until the queue is empty. Each caller receives its own result after COMMIT returned.
//
// Each operation runs inside its own SAVEPOINT, so an operation whose statement fails is undone
// alone (ROLLBACK TO) and reported as not applied, while the others of the group go on. A
// single failed statement is already undone by SQLite's statement journal; the savepoint is what
// undoes a publication whose first statement succeeded and whose second failed, and ROLLBACK TO
// failing is how the writer learns that SQLite has rolled back the whole transaction (it does so
// after an I/O error, a full disk, an interrupt or lack of memory). Then nothing of the group was
// committed and every operation reports its error as not applied, and the writer stops: a
// following statement would run in autocommit mode, outside the group.
//
// A failed COMMIT fails every operation that succeeded in the group: as not applied when SQLite
// certainly rolled back (classify), otherwise with an unknown outcome. TestGroupFailedCommit
// forces the certain rollback at COMMIT; a ROLLBACK TO that fails and a COMMIT that fails
// with an unknown outcome are not forced by a test. An operation alone in the
// queue runs in a transaction of its own, without a savepoint (the transaction is one), in its
// caller's goroutine, so one writer's latency is one commit as before. Durability does not
// change: the commit is the same fsync'd commit.

// writeOp is one operation waiting for the writer.
type writeOp struct {
	ctx context.Context
	// run executes the operation's statements on the group's connection and keeps its result
	// in the closure. It must not commit or roll back.
	run  func(ctx context.Context, conn *sql.Conn) error
	err  error
	done chan struct{}
}

// writer is the queue of one driver's writes.
type writer struct {
	mu      sync.Mutex
	queue   []*writeOp
	running bool // a writer (a caller, or the writer goroutine) is draining the queue
	// one takes one operation per transaction, as before group commit: the baseline that the
	// benchmarks and the barrier test's mutation compare with.
	one bool
	// noSavepoints runs the operations of a group without their savepoints: the mutation that
	// the barrier test must catch.
	noSavepoints bool
	// hooks for tests, set under mu: beforeTake runs in the writer before it takes the queue;
	// committed after each transaction with the number of operations it carried (negative if
	// they were rolled back before COMMIT) and the error that ended it; queued after an
	// operation joined the queue, with the queue's length.
	beforeTake func()
	committed  func(n int, err error)
	queued     func(n int)
}

// exec queues run and waits for its result, which is final: an error wraps driver.ErrNotApplied
// exactly when the operation certainly did not take effect. Waiting is cut short by ctx as long as the writer
// has not taken the operation; the result is then not applied, since nothing was sent.
func (d *Driver) exec(ctx context.Context, run func(ctx context.Context, conn *sql.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return driver.NotApplied(err)
	}
	op := &writeOp{ctx: ctx, run: run, done: make(chan struct{})}
	w := &d.w
	w.mu.Lock()
	w.queue = append(w.queue, op)
	n := len(w.queue)
	lead := !w.running // then the queue held nothing but op
	w.running = true
	hook := w.queued
	w.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	if lead {
		// No writer: this caller writes its own group (op and whatever queued meanwhile) in
		// its own goroutine, which spares a lone writer two goroutine switches, and leaves
		// what queued during its commit to a writer goroutine.
		d.runGroup()
		w.mu.Lock()
		more := len(w.queue) > 0
		w.running = more
		w.mu.Unlock()
		if more {
			go d.drain()
		}
		<-op.done
		return op.err
	}
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
	}
	w.mu.Lock()
	for i, q := range w.queue {
		if q == op {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			w.mu.Unlock()
			return driver.NotApplied(ctx.Err())
		}
	}
	w.mu.Unlock()
	<-op.done // taken: the outcome is the transaction's
	return op.err
}

// drain runs groups until the queue is empty.
func (d *Driver) drain() {
	for d.runGroup() {
	}
}

// runGroup takes what is queued (one operation in the w.one mode) and commits it as one group;
// with nothing queued it marks the writer stopped and returns false.
func (d *Driver) runGroup() bool {
	w := &d.w
	w.mu.Lock()
	hook := w.beforeTake
	w.mu.Unlock()
	if hook != nil {
		hook()
	}
	w.mu.Lock()
	var group []*writeOp
	if w.one && len(w.queue) > 0 {
		group = []*writeOp{w.queue[0]}
		w.queue = w.queue[1:]
	} else {
		group, w.queue = w.queue, nil
	}
	if len(group) == 0 {
		w.running = false
		w.mu.Unlock()
		return false
	}
	savepoints := !w.noSavepoints
	w.mu.Unlock()
	d.commitGroup(group, savepoints)
	return true
}

// commitGroup applies the group in one IMMEDIATE transaction and hands every operation its
// result. The statements run without the callers' cancellation: an interrupted statement
// would roll back the whole transaction, that is every other caller's operation too.
func (d *Driver) commitGroup(group []*writeOp, savepoints bool) {
	ctx := context.Background()
	live := group[:0:0]
	for _, op := range group {
		if err := op.ctx.Err(); err != nil {
			finish(op, driver.NotApplied(err)) // gave up before anything was sent
			continue
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return
	}
	fail := func(err error) {
		for _, op := range live {
			finish(op, err)
		}
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		fail(driver.NotApplied(err))
		return
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		fail(driver.NotApplied(err)) // no transaction, nothing written
		return
	}
	// An operation alone needs no savepoint: its transaction is its savepoint.
	savepoints = savepoints && len(live) > 1
	savepoint, release := d.savepointStmts(ctx, conn, savepoints)
	defer savepoint.close()
	defer release.close()
	for _, op := range live {
		if savepoints {
			if err := savepoint.exec(ctx); err != nil {
				d.abort(ctx, conn, live, err)
				return
			}
		}
		if err := op.run(ctx, conn); err != nil {
			if len(live) == 1 {
				op.err = err
				d.abort(ctx, conn, live, err)
				return
			}
			if !savepoints {
				op.err = driver.NotApplied(err)
				continue
			}
			if _, rerr := conn.ExecContext(ctx, "ROLLBACK TO fenced_op"); rerr != nil {
				// SQLite rolled back the transaction: nothing of the group is left.
				op.err = err
				d.abort(ctx, conn, live, err)
				return
			}
			op.err = driver.NotApplied(err) // undone to its savepoint; the group goes on
		}
		if !savepoints {
			continue
		}
		if err := release.exec(ctx); err != nil {
			d.abort(ctx, conn, live, err)
			return
		}
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	if err != nil {
		err = classify(err)
		// The transaction may still be open after a failed COMMIT: end it (or discard the
		// connection) so that nothing of it reaches the pool.
		d.rollback(ctx, conn)
	}
	d.w.hookCommitted(len(live), err)
	for _, op := range live {
		if err != nil && op.err == nil {
			op.err = err
		}
		close(op.done)
	}
}

// savepointStmts prepares SAVEPOINT and RELEASE once for the group: a group of n operations
// runs each n times, and parsing them again every time costs more than running them.
func (d *Driver) savepointStmts(ctx context.Context, conn *sql.Conn, needed bool) (savepoint, release fixedStmt) {
	if !needed {
		return fixedStmt{conn: conn, text: "SAVEPOINT fenced_op"}, fixedStmt{conn: conn, text: "RELEASE fenced_op"}
	}
	return prepareFixed(ctx, conn, "SAVEPOINT fenced_op"), prepareFixed(ctx, conn, "RELEASE fenced_op")
}

// fixedStmt is a statement without arguments, prepared when that worked.
type fixedStmt struct {
	conn *sql.Conn
	text string
	stmt *sql.Stmt
}

func prepareFixed(ctx context.Context, conn *sql.Conn, text string) fixedStmt {
	st, err := conn.PrepareContext(ctx, text)
	if err != nil {
		st = nil // the first exec reports the error
	}
	return fixedStmt{conn: conn, text: text, stmt: st}
}

func (f fixedStmt) exec(ctx context.Context) error {
	var err error
	if f.stmt != nil {
		_, err = f.stmt.ExecContext(ctx)
	} else {
		_, err = f.conn.ExecContext(ctx, f.text)
	}
	return err
}

func (f fixedStmt) close() {
	if f.stmt != nil {
		_ = f.stmt.Close()
	}
}

// abort ends a group that cannot be committed: ROLLBACK, and every operation fails with its own
// error or cause, as not applied since nothing was committed. Should even ROLLBACK fail, the
// connection is discarded (closing it rolls back) and the outcome is reported unknown.
func (d *Driver) abort(ctx context.Context, conn *sql.Conn, group []*writeOp, cause error) {
	certain := d.rollback(ctx, conn)
	d.w.hookCommitted(-len(group), cause)
	for _, op := range group {
		err := op.err
		if err == nil {
			err = fmt.Errorf("the operation was rolled back with its group: %w", cause)
		}
		if certain {
			err = driver.NotApplied(err)
		}
		finish(op, err)
	}
}

// rollback ends the connection's transaction and reports whether it certainly is ended.
// "no transaction is active" counts: SQLite rolled back by itself.
func (d *Driver) rollback(ctx context.Context, conn *sql.Conn) bool {
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err == nil || isNoTransaction(err) {
		return true
	}
	_ = conn.Raw(func(any) error { return sqldriver.ErrBadConn }) // closed, not reused
	return false
}

func isNoTransaction(err error) bool {
	return strings.Contains(err.Error(), "no transaction is active")
}

func (w *writer) hookCommitted(n int, err error) {
	w.mu.Lock()
	hook := w.committed
	w.mu.Unlock()
	if hook != nil {
		hook(n, err)
	}
}

func finish(op *writeOp, err error) {
	op.err = err
	close(op.done)
}
