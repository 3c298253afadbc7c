package sqlite

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

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
// An operation that fails must be undone alone, and the others of its group must go on. The
// writer first runs the group without savepoints, since operations almost never fail and each
// savepoint costs two statements per operation. When an operation does fail, the writer rolls
// the whole transaction back (nothing of it was committed), reports that operation as not
// applied, and runs the rest of the group again, in queue order, in a new transaction where
// each operation has its own SAVEPOINT: there, an operation whose statement fails is undone
// alone (ROLLBACK TO), and ROLLBACK TO failing is how the writer learns that SQLite has rolled
// back the whole transaction (it does so after an I/O error, a full disk, an interrupt or lack
// of memory); then nothing of the group was committed, every operation reports its error as
// not applied, and the writer stops: a following statement would run in autocommit mode,
// outside the group. Running the rest again is sound because nothing of the first run was
// committed, and more exact than going on would be: a publication whose first statement
// succeeded and whose second failed left a change that the operations after it would have
// seen. An operation's run function may therefore run twice; only its last run's results
// count (every run function assigns all of its results).
//
// A failed COMMIT fails every operation that succeeded in the group: as not applied when SQLite
// certainly rolled back (classify), otherwise with an unknown outcome. TestGroupFailedCommit
// forces the certain rollback at COMMIT; a ROLLBACK TO that fails and a COMMIT that fails
// with an unknown outcome are not forced by a test. An operation alone in the queue runs in a
// transaction of its own (the transaction is its savepoint), in its caller's goroutine, so one
// writer's latency is one commit as before. Durability does not change: the commit is the same
// fsync'd commit.
//
// The writer keeps its connection from one group to the next, and each statement text is
// prepared on it once and run as often as any later group needs it (writeConn): sixteen
// acquisitions parse one UPDATE, and the next group parses none.

// writeOp is one operation waiting for the writer.
type writeOp struct {
	ctx context.Context
	// run executes the operation's statements through q, on the group's connection, and keeps
	// its result in the closure. It must not commit or roll back; it may run more than once.
	run func(ctx context.Context, q querier) error
	// ok, when set, is where run records whether the destination granted the operation: a
	// caller refused (busy, not the holder) is not counted among the callers the gathering
	// window waits for, since it does not come back at once (gather).
	ok   *bool
	err  error
	done chan struct{}
}

// commitMode is how the writer takes the queue. Only commitGroup is used outside tests and
// benchmarks.
type commitMode int

const (
	commitGroup commitMode = iota // everything queued, in one transaction
	// commitOne takes one operation per transaction: the mutation that the barrier test must
	// catch.
	commitOne
	// commitLegacy runs one operation at a time in autocommit mode, every statement its own
	// transaction, as the driver did before group commit: the benchmarks' baseline. An
	// operation of two statements is not atomic in this mode; the benchmarks use acquisitions
	// and releases, one statement each.
	commitLegacy
)

// writer is the queue of one driver's writes.
type writer struct {
	mu      sync.Mutex
	queue   []*writeOp
	running bool // a writer (a caller, or the writer goroutine) is draining the queue
	mode    commitMode
	// mutations that the barrier test must catch: noRedo goes on after a failed operation
	// without rolling back and running the rest again; noRollbackTo, in the run with
	// savepoints, goes on after a failed operation without rolling back to its savepoint.
	noRedo, noRollbackTo bool
	// hooks for tests, set under mu: beforeTake runs in the writer before it takes the queue;
	// committed after each transaction with the number of operations it carried (negative if
	// they were rolled back before COMMIT) and the error that ended it; queued after an
	// operation joined the queue, with the queue's length.
	beforeTake func()
	committed  func(n int, err error)
	queued     func(n int)
	// gathering runs when the writer starts waiting in gather, stopped when it finds the queue
	// empty and stops; gatherLimit, when positive, replaces gather's time limit, and when
	// negative turns gathering off (the mutation that TestGatherWokenCallers must catch).
	gathering, stopped func()
	gatherLimit        time.Duration
	// gatherRefused counts refused callers among those the window waits for: the mutation
	// that TestGatherGrantedOnly must catch.
	gatherRefused bool

	// The gathering window (gather): arrived counts the operations ever queued; a commit
	// records how many it woke (woke), the count at that moment (wokeAt) and how long it took;
	// full is closed when arrived reaches want.
	arrived, wokeAt, want int64
	woke                  int
	took                  time.Duration
	full                  chan struct{}
}

// exec queues run and waits for its result, which is final: an error wraps driver.ErrNotApplied
// exactly when the operation certainly did not take effect. Waiting is cut short by ctx as long as the writer
// has not taken the operation; the result is then not applied, since nothing was sent.
func (d *Driver) exec(ctx context.Context, run func(ctx context.Context, q querier) error) error {
	return d.execOK(ctx, nil, run)
}

// execOK is exec for an operation the destination may refuse: run stores in *ok whether it
// was granted (gather).
func (d *Driver) execOK(ctx context.Context, ok *bool, run func(ctx context.Context, q querier) error) error {
	if err := ctx.Err(); err != nil {
		return driver.NotApplied(err)
	}
	op := &writeOp{ctx: ctx, run: run, ok: ok, done: make(chan struct{})}
	w := &d.w
	w.mu.Lock()
	w.queue = append(w.queue, op)
	n := len(w.queue)
	w.arrived++
	if w.full != nil && w.arrived >= w.want {
		close(w.full)
		w.full = nil
	}
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
		// A writer goroutine goes on if operations queued meanwhile, or if the commit woke
		// other callers whose next operations it may gather.
		more := len(w.queue) > 0 || w.woke > 1
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
	for {
		d.gather()
		if !d.runGroup() {
			return
		}
	}
}

// gather is the window that lets a group grow when others are queued. The callers of the group
// just committed were woken with their results, and a caller that goes on (a release after its
// acquisition) queues its next operation within microseconds; the writer, which would otherwise
// take only what queued during that commit, waits for as many operations to arrive as it woke,
// or for half the last commit's duration, whichever comes first. Without it, callers split
// into two cohorts that take turns (16 callers: groups of 8; measured in
// BenchmarkGroupCommitTurns, ops/commit). It waits only after a commit that woke several
// callers, so a lone caller, whose group is its own, never waits; an operation that arrives
// meanwhile waits at most half a commit (and never more than maxGather) before its group
// starts. Only callers whose operation was granted count (returning): a refused one is not
// back soon. TestGatherWokenCallers and TestGatherGrantedOnly force the schedules.
func (d *Driver) gather() {
	w := &d.w
	w.mu.Lock()
	if w.mode != commitGroup || w.woke < 2 || w.gatherLimit < 0 {
		w.woke = 0
		w.mu.Unlock()
		return
	}
	want := w.wokeAt + int64(w.woke)
	w.woke = 0
	if w.arrived >= want {
		w.mu.Unlock()
		return
	}
	full := make(chan struct{})
	w.full, w.want = full, want
	wait := min(w.took/2, maxGather)
	if w.gatherLimit > 0 {
		wait = w.gatherLimit
	}
	hook := w.gathering
	w.mu.Unlock()
	if hook != nil {
		hook()
	}
	t := time.NewTimer(wait)
	select {
	case <-full:
	case <-t.C:
	}
	t.Stop()
	w.mu.Lock()
	w.full = nil
	w.mu.Unlock()
}

// returning counts the callers of a committed group that the gathering window waits for:
// those whose operation succeeded and was granted. A refused caller (an acquisition of a
// resource someone holds, a renewal or publication by a lease that lost its hold) does not
// queue its next operation at once: the driver first reads the row that refused it, and the
// caller then backs off or gives up. Waiting for such callers would hold the writer after
// nearly every commit on a hot resource (callers retrying one resource, almost every attempt
// refused) until the window's timer, for operations that mostly do not come
// (TestGatherGrantedOnly). Called with w.mu held.
func (w *writer) returning(group []*writeOp, err error) int {
	if err != nil {
		return 0
	}
	n := 0
	for _, op := range group {
		if op.err == nil && (op.ok == nil || *op.ok || w.gatherRefused) {
			n++
		}
	}
	return n
}

// maxGather bounds the gathering window whatever a commit took (a slow disk, a paused process).
const maxGather = 2 * time.Millisecond

// runGroup takes what is queued (one operation in the commitOne and commitLegacy modes) and
// commits it as one group; with nothing queued it marks the writer stopped and returns false.
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
	if w.mode != commitGroup && len(w.queue) > 0 {
		group = []*writeOp{w.queue[0]}
		w.queue = w.queue[1:]
	} else {
		group, w.queue = w.queue, nil
	}
	if len(group) == 0 {
		w.running = false
		hook := w.stopped
		w.mu.Unlock()
		if hook != nil {
			hook()
		}
		return false
	}
	mode, noRedo, noRollbackTo := w.mode, w.noRedo, w.noRollbackTo
	w.mu.Unlock()
	if mode == commitLegacy {
		d.autocommit(group[0])
		return true
	}
	if group = d.commitGroup(group, false, noRedo, false); len(group) > 0 {
		d.commitGroup(group, true, false, noRollbackTo)
	}
	return true
}

// autocommit runs op's statements outside any transaction (commitLegacy).
func (d *Driver) autocommit(op *writeOp) {
	ctx := context.Background()
	if err := op.ctx.Err(); err != nil {
		finish(op, driver.NotApplied(err))
		return
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		finish(op, driver.NotApplied(err))
		return
	}
	defer conn.Close()
	finish(op, classify(op.run(ctx, conn)))
}

// commitGroup applies the group in one IMMEDIATE transaction and hands every operation its
// result. Without savepoints, an operation that fails makes it roll the transaction back and
// return the operations to run again (all others of the group, in order; see above); with them
// it returns nil. noRedo and noRollbackTo are the mutations (writer). The statements run
// without the callers' cancellation: an interrupted statement would roll back the whole
// transaction, that is every other caller's operation too.
func (d *Driver) commitGroup(group []*writeOp, savepoints, noRedo, noRollbackTo bool) (redo []*writeOp) {
	ctx := context.Background()
	start := time.Now()
	live := group[:0:0]
	for _, op := range group {
		op.err = nil
		if err := op.ctx.Err(); err != nil {
			finish(op, driver.NotApplied(err)) // gave up before anything was sent
			continue
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return nil
	}
	fail := func(err error) {
		for _, op := range live {
			finish(op, err)
		}
	}
	q := &d.wc
	if err := q.lock(ctx, d.db); err != nil {
		fail(driver.NotApplied(err))
		return nil
	}
	defer q.unlock(d.db)
	if _, err := q.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		fail(driver.NotApplied(err)) // no transaction, nothing written
		return nil
	}
	// An operation alone needs no savepoint: its transaction is its savepoint.
	savepoints = savepoints && len(live) > 1
	for i, op := range live {
		if savepoints {
			if _, err := q.ExecContext(ctx, "SAVEPOINT fenced_op"); err != nil {
				d.abort(ctx, live, err)
				return nil
			}
		}
		if err := op.run(ctx, q); err != nil {
			switch {
			case len(live) == 1:
				op.err = err
				d.abort(ctx, live, err)
				return nil
			case !savepoints && !noRedo:
				return d.redo(ctx, live, i, err)
			case !savepoints || noRollbackTo:
				op.err = driver.NotApplied(err) // the mutations: whatever op wrote stays
				continue
			}
			if _, rerr := q.ExecContext(ctx, "ROLLBACK TO fenced_op"); rerr != nil {
				// SQLite rolled back the transaction: nothing of the group is left.
				op.err = err
				d.abort(ctx, live, err)
				return nil
			}
			op.err = driver.NotApplied(err) // undone to its savepoint; the group goes on
		}
		if !savepoints {
			continue
		}
		if _, err := q.ExecContext(ctx, "RELEASE fenced_op"); err != nil {
			d.abort(ctx, live, err)
			return nil
		}
	}
	_, err := q.ExecContext(ctx, "COMMIT")
	if err != nil {
		err = classify(err)
		// The transaction may still be open after a failed COMMIT: end it (or discard the
		// connection) so that nothing of it reaches the next group.
		d.rollback(ctx)
	}
	d.w.hookCommitted(len(live), err)
	d.w.mu.Lock()
	d.w.wokeAt, d.w.woke, d.w.took = d.w.arrived, d.w.returning(live, err), time.Since(start)
	d.w.mu.Unlock()
	for _, op := range live {
		if err != nil && op.err == nil {
			op.err = err
		}
		close(op.done)
	}
	return nil
}

// redo ends a group without savepoints whose operation live[failed] failed: it rolls the
// transaction back, reports that operation as not applied, and returns the others to run again.
// Should the rollback not be certain, every operation's outcome is unknown and none runs again.
func (d *Driver) redo(ctx context.Context, live []*writeOp, failed int, err error) []*writeOp {
	if !d.rollback(ctx) {
		live[failed].err = err
		d.w.hookCommitted(-len(live), err)
		for _, op := range live {
			if op.err == nil {
				op.err = fmt.Errorf("the operation's transaction may or may not have been rolled back with its group: %w", err)
			}
			close(op.done)
		}
		return nil
	}
	d.w.hookCommitted(-len(live), err)
	finish(live[failed], driver.NotApplied(err))
	return append(live[:failed:failed], live[failed+1:]...)
}

// writeConn is the writer's connection, kept from one group to the next, with every statement
// text the writer ran prepared on it once: parsing a statement cost SQLite about as much as
// running it (about half of the writer's time for a lone caller, a quarter with sixteen
// callers: docs/BENCHMARKS.md, session 14), and a connection of the pool could not keep them. Only the writer uses it, one group at a time (mu, which Close also takes). A prepared
// statement is reset once run (modernc.org/sqlite resets it after Exec and when its rows are
// closed, and queryOne always closes them), so none is left running at COMMIT.
type writeConn struct {
	mu     sync.Mutex
	conn   *sql.Conn
	stmts  map[string]*sql.Stmt
	closed bool
	// prepared counts the statements ever prepared: the test that shows statements outliving
	// their group reads it.
	prepared int
}

// maxStmts bounds the statements kept prepared. The driver runs a few dozen texts; one past the
// bound runs unprepared.
const maxStmts = 64

// errDriverClosed is the writer's answer after Close.
var errDriverClosed = errors.New("the SQLite driver is closed")

// lock takes the connection for a group, opening one from the pool if none is kept. On error
// the lock is not held.
func (c *writeConn) lock(ctx context.Context, db *sql.DB) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errDriverClosed
	}
	if c.conn != nil {
		return nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.conn = conn
	return nil
}

// unlock ends the group. The connection is kept unless the pool allows only one (a handle the
// caller opened with SetMaxOpenConns(1)): kept, it would leave none for the reads.
func (c *writeConn) unlock(db *sql.DB) {
	if c.conn != nil && db.Stats().MaxOpenConnections == 1 {
		c.drop()
	}
	c.mu.Unlock()
}

// drop finalizes the statements and gives the connection back to the pool. Called with mu held.
func (c *writeConn) drop() {
	for _, st := range c.stmts {
		_ = st.Close()
	}
	c.stmts = nil
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// discard drops the connection and makes the pool close it, not reuse it: its transaction may
// still be open. Called with mu held.
func (c *writeConn) discard() {
	_ = c.conn.Raw(func(any) error { return sqldriver.ErrBadConn }) // closes c.conn and its statements
	c.drop()
}

// close ends the writer's use of the connection for good (Driver.Close).
func (c *writeConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop()
	c.closed = true
}

func (c *writeConn) stmt(ctx context.Context, query string) *sql.Stmt {
	if st, ok := c.stmts[query]; ok {
		return st
	}
	if len(c.stmts) >= maxStmts {
		return nil
	}
	st, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil // run unprepared: the statement reports its own error
	}
	if c.stmts == nil {
		c.stmts = make(map[string]*sql.Stmt)
	}
	c.stmts[query] = st
	c.prepared++
	return st
}

func (c *writeConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return c.conn.ExecContext(ctx, query, args...)
}

func (c *writeConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return c.conn.QueryContext(ctx, query, args...)
}

func (c *writeConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return c.conn.QueryRowContext(ctx, query, args...)
}

// abort ends a group that cannot be committed: ROLLBACK, and every operation fails with its own
// error or cause, as not applied since nothing was committed. Should even ROLLBACK fail, the
// connection is discarded (closing it rolls back) and the outcome is reported unknown.
func (d *Driver) abort(ctx context.Context, group []*writeOp, cause error) {
	certain := d.rollback(ctx)
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

// rollback ends the writer connection's transaction and reports whether it certainly is ended.
// "no transaction is active" counts: SQLite rolled back by itself. Otherwise the connection is
// discarded (closing it rolls back). Called with d.wc held.
func (d *Driver) rollback(ctx context.Context) bool {
	if _, err := d.wc.ExecContext(ctx, "ROLLBACK"); err == nil || isNoTransaction(err) {
		return true
	}
	d.wc.discard()
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
