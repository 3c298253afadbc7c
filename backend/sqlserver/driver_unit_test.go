package sqlserver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"

	mssql "github.com/microsoft/go-mssqldb"

	"github.com/fenced-dev/fenced/driver"
)

// These tests run the driver over the recording stub (recorder_test.go): they check which
// statement each method sends, with which named parameters in which order, and how each reply
// is read. They say nothing about behavior under concurrency; see sqlserver_test.go.

var (
	t0    = time.Date(2026, 1, 2, 3, 4, 5, 600700800, time.UTC)
	lease = driver.LeaseRef{Resource: "jobs/é", Owner: "OWNER1", Epoch: 2, Generation: 7}
)

type arg struct {
	name  string
	value any
}

func wantCall(t *testing.T, got call, kind, query string, args ...arg) {
	t.Helper()
	if got.kind != kind || got.query != query {
		t.Errorf("sent %s\n%s\nwant %s\n%s", got.kind, got.query, kind, query)
	}
	var have []arg
	for _, a := range got.args {
		have = append(have, arg{a.Name, a.Value})
	}
	if !reflect.DeepEqual(have, args) {
		t.Errorf("arguments %#v, want %#v", have, args)
	}
}

// newTestDriver returns a driver over the recording stub.
func newTestDriver(t *testing.T, replies ...reply) (*Driver, *recorder) {
	rec, db := newRecorder(t, replies...)
	return New(db), rec
}

func ctxT(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func acquireSets(rows ...[]sqldriver.Value) []resultSet {
	cols := []string{"epoch", "generation", "lease_until", "acquired"}
	return []resultSet{{cols: cols, rows: rows}}
}

func TestAcquireSendsItsParameters(t *testing.T) {
	d, rec := newTestDriver(t, reply{sets: acquireSets([]sqldriver.Value{int64(3), int64(8), t0, int64(1)})})
	g, err := d.Acquire(ctxT(t), "jobs/é", "OWNER1", 90*time.Minute+1500*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	if g.Epoch != 3 || g.Generation != 8 || !g.LeaseUntil.Equal(t0) || g.LeaseUntil.Location() != time.UTC {
		t.Fatalf("grant %+v", g)
	}
	calls := rec.Calls()
	if len(calls) != 1 {
		t.Fatalf("%d calls", len(calls))
	}
	wantCall(t, calls[0], "query", d.sql.procedure[opAcquire],
		arg{"resource", "jobs/é"}, arg{"owner", "OWNER1"}, arg{"ttl_s", int32(5400)}, arg{"ttl_us", int32(1500)})
}

func TestAcquireReadsTheWholeReply(t *testing.T) {
	busyRow := []sqldriver.Value{int64(2), int64(9), t0, int64(0)}
	tests := []struct {
		name    string
		reply   reply
		check   func(driver.Grant, error) error
		attempt int
	}{
		{"busy: the update matched nothing, the holder follows", reply{sets: append(acquireSets(),
			acquireSets(busyRow)...)}, func(_ driver.Grant, err error) error {
			var busy *driver.BusyError
			if !errors.As(err, &busy) || busy.Epoch != 2 || busy.Generation != 9 || !busy.LeaseUntil.Equal(t0) {
				return fmt.Errorf("got %v, want busy at generation 9", err)
			}
			return nil
		}, 1},
		{"busy with a free row read after (a release came in between)", reply{sets: append(acquireSets(),
			acquireSets([]sqldriver.Value{int64(2), int64(9), nil, int64(0)})...)}, func(_ driver.Grant, err error) error {
			var busy *driver.BusyError
			if !errors.As(err, &busy) || !busy.LeaseUntil.IsZero() {
				return fmt.Errorf("got %v, want busy with no expiry", err)
			}
			return nil
		}, 1},
		{"not provisioned: no row anywhere", reply{sets: append(acquireSets(), acquireSets()...)},
			func(_ driver.Grant, err error) error {
				if !errors.Is(err, driver.ErrNotFound) {
					return fmt.Errorf("got %v, want ErrNotFound", err)
				}
				return nil
			}, 1},
		{"an error after the OUTPUT row voids it", reply{sets: acquireSets([]sqldriver.Value{int64(2), int64(8), t0, int64(1)}),
			rowsErr: mssql.Error{Number: 8115, Message: "Arithmetic overflow"}},
			func(g driver.Grant, err error) error {
				var busy *driver.BusyError
				if err == nil || g.Generation != 0 || errors.As(err, &busy) || errors.Is(err, driver.ErrNotFound) {
					return fmt.Errorf("got %+v, %v; want an operational error and no grant", g, err)
				}
				return nil
			}, 1},
		{"two rows: not a unique key", reply{sets: acquireSets([]sqldriver.Value{int64(2), int64(8), t0, int64(1)},
			[]sqldriver.Value{int64(2), int64(8), t0, int64(1)})}, func(_ driver.Grant, err error) error {
			if err == nil || !strings.Contains(err.Error(), "not unique") {
				return fmt.Errorf("got %v", err)
			}
			return nil
		}, 1},
		{"a query error is not busy", reply{err: errors.New("connection reset")},
			func(_ driver.Grant, err error) error {
				var busy *driver.BusyError
				if err == nil || errors.As(err, &busy) || errors.Is(err, driver.ErrNotFound) {
					return fmt.Errorf("got %v", err)
				}
				return nil
			}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, rec := newTestDriver(t, tt.reply)
			g, err := d.Acquire(ctxT(t), "r", "o", time.Minute)
			if e := tt.check(g, err); e != nil {
				t.Fatal(e)
			}
			if n := len(rec.Calls()); n != tt.attempt {
				t.Fatalf("%d calls, want %d", n, tt.attempt)
			}
		})
	}
}

func TestRenewSendsItsParameters(t *testing.T) {
	until := []resultSet{{cols: []string{"lease_until"}, rows: [][]sqldriver.Value{{t0}}}}
	d, rec := newTestDriver(t, reply{sets: until}, reply{sets: []resultSet{{cols: []string{"lease_until"}}}})
	got, ok, err := d.Renew(ctxT(t), lease, 40*time.Minute)
	if err != nil || !ok || !got.Equal(t0) {
		t.Fatalf("renew: %v %v %v", got, ok, err)
	}
	if _, ok, err := d.Renew(ctxT(t), lease, time.Minute); ok || err != nil {
		t.Fatalf("renew with no row back: ok %v, err %v; want refused", ok, err)
	}
	calls := rec.Calls()
	wantCall(t, calls[0], "query", d.sql.procedure[opRenew], arg{"resource", "jobs/é"}, arg{"owner", "OWNER1"},
		arg{"generation", int64(7)}, arg{"epoch", int64(2)}, arg{"ttl_s", int32(2400)}, arg{"ttl_us", int32(0)})
}

func count(n int64) reply {
	return reply{sets: []resultSet{{cols: []string{"n"}, rows: [][]sqldriver.Value{{n}}}}}
}

func outputRows(n int) reply {
	rows := make([][]sqldriver.Value, n)
	for i := range rows {
		rows[i] = []sqldriver.Value{int64(7)}
	}
	return reply{sets: []resultSet{{cols: []string{"generation"}, rows: rows}}}
}

func TestPublishReleaseSendTheirParameters(t *testing.T) {
	payload := []byte{0, 1, 2}
	pub := driver.Publication{Payload: payload, OpID: "op-1", SourceVersion: 12}
	leaseArgs := []arg{{"resource", "jobs/é"}, {"owner", "OWNER1"}, {"generation", int64(7)}, {"epoch", int64(2)}}
	pubArgs := func(p []byte, sv int64, id string) []arg {
		return append(append([]arg(nil), leaseArgs...), arg{"payload", p}, arg{"source_version", sv}, arg{"op_id", id})
	}
	// Exactly one published or freed row is acceptance; none is refusal; more is an error.
	counts := []reply{count(1), count(0), count(2)}
	outputs := []reply{outputRows(1), outputRows(0), outputRows(2)}
	tests := []struct {
		name    string
		op      op
		replies []reply
		run     func(*Driver, context.Context) (bool, error)
		args    []arg
	}{
		{"publish", opPublish, counts,
			func(d *Driver, c context.Context) (bool, error) { return d.Publish(c, lease, pub) }, pubArgs(payload, 12, "op-1")},
		{"publish empty", opPublish, counts,
			func(d *Driver, c context.Context) (bool, error) {
				return d.Publish(c, lease, driver.Publication{OpID: "op-2"})
			}, pubArgs([]byte{}, 0, "op-2")},
		{"publish and release", opPublishAndRelease, counts,
			func(d *Driver, c context.Context) (bool, error) { return d.PublishAndRelease(c, lease, pub) }, pubArgs(payload, 12, "op-1")},
		{"release", opRelease, outputs,
			func(d *Driver, c context.Context) (bool, error) { return d.Release(c, lease) }, leaseArgs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, rec := newTestDriver(t, tt.replies...)
			for i, want := range []struct {
				ok  bool
				err bool
			}{{true, false}, {false, false}, {false, true}} {
				ok, err := tt.run(d, ctxT(t))
				if ok != want.ok || (err != nil) != want.err {
					t.Errorf("reply %d: ok %v err %v, want ok %v error %v", i, ok, err, want.ok, want.err)
				}
			}
			for _, c := range rec.Calls() {
				wantCall(t, c, "query", d.sql.procedure[tt.op], tt.args...)
			}
		})
	}
}

func TestPublishDuplicateOperationIsRefused(t *testing.T) {
	// The range lock should make this impossible; if the insert still meets the id, XACT_ABORT
	// rolled the publication back and the id is someone else's: refused, not an error.
	d, rec := newTestDriver(t, reply{err: mssql.Error{Number: errDuplicateKey, Class: 14, Message: "Violation of PRIMARY KEY constraint"}})
	ok, err := d.Publish(ctxT(t), lease, driver.Publication{OpID: "op-1"})
	if ok || err != nil {
		t.Fatalf("publish meeting a recorded id: %v, %v; want refused", ok, err)
	}
	if n := len(rec.Calls()); n != 1 {
		t.Fatalf("%d calls, want 1 (a duplicate key is not retried)", n)
	}
}

func TestOperationsSendTheirParameters(t *testing.T) {
	opCols := []string{"outcome", "resource", "epoch", "generation", "recorded_at"}
	accepted := reply{sets: []resultSet{{cols: opCols, rows: [][]sqldriver.Value{{"accepted", "jobs/é", int64(2), int64(7), t0}}}}}
	aborted := reply{sets: []resultSet{{cols: opCols, rows: [][]sqldriver.Value{{"aborted", nil, nil, nil, t0}}}}}
	none := reply{sets: []resultSet{{cols: opCols}}}
	d, rec := newTestDriver(t, accepted, aborted, none, none, count(5), count(3))
	c := ctxT(t)

	op, err := d.ResolveOperation(c, "op-1")
	want := driver.Operation{OpID: "op-1", Outcome: "accepted", Resource: "jobs/é", Epoch: 2, Generation: 7, RecordedAt: t0}
	if err != nil || op != want {
		t.Fatalf("resolve accepted: %+v, %v", op, err)
	}
	if op, err := d.ResolveOperation(c, "op-2"); err != nil || op != (driver.Operation{OpID: "op-2", Outcome: "aborted", RecordedAt: t0}) {
		t.Fatalf("resolve aborted: %+v, %v", op, err)
	}
	if _, err := d.ResolveOperation(c, "op-3"); err == nil {
		t.Fatal("resolve with no outcome back is not an error")
	}
	if op, err := d.ReadOperation(c, "op-4"); err != nil || op != (driver.Operation{OpID: "op-4"}) {
		t.Fatalf("read an unrecorded id: %+v, %v", op, err)
	}
	if e, err := d.BumpEpoch(c); err != nil || e != 5 {
		t.Fatalf("bump epoch: %d, %v", e, err)
	}
	if n, err := d.PruneOperations(c, 36*time.Hour+250*time.Millisecond); err != nil || n != 3 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	calls := rec.Calls()
	wantCall(t, calls[0], "query", d.sql.procedure[opResolve], arg{"op_id", "op-1"})
	wantCall(t, calls[1], "query", d.sql.procedure[opResolve], arg{"op_id", "op-2"})
	wantCall(t, calls[3], "query", d.sql.procedure[opReadOperation], arg{"op_id", "op-4"})
	wantCall(t, calls[4], "query", d.sql.procedure[opBumpEpoch])
	wantCall(t, calls[5], "query", d.sql.procedure[opPrune], arg{"age_s", int32(129600)}, arg{"age_us", int32(250000)})

	d, rec = newTestDriver(t)
	if _, err := d.PruneOperations(c, 0); err == nil {
		t.Fatal("prune with age 0")
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements sent", n)
	}
}

func TestBumpEpochWithoutMetaRow(t *testing.T) {
	d, _ := newTestDriver(t, reply{sets: []resultSet{{cols: []string{"epoch"}, rows: [][]sqldriver.Value{{nil}}}}})
	if _, err := d.BumpEpoch(ctxT(t)); err == nil || !strings.Contains(err.Error(), "no epoch row") {
		t.Fatalf("bump epoch with no meta row: %v", err)
	}
}

func TestProvisionAndReadsSendTheResource(t *testing.T) {
	read := []resultSet{{cols: []string{"e", "g", "o", "u", "pe", "pg", "pa", "sv", "n", "ce", "now"},
		rows: [][]sqldriver.Value{{int64(1), int64(3), "OWNER1", t0, int64(1), int64(2), t0.Add(-time.Hour), int64(9),
			int64(5), int64(2), t0.Add(-time.Second)}}}}
	payload := []resultSet{{cols: []string{"pg", "p"}, rows: [][]sqldriver.Value{{int64(2), []byte("hello")}}}}
	d, rec := newTestDriver(t, reply{}, reply{sets: read}, reply{sets: payload})
	c := ctxT(t)
	if err := d.Provision(c, "jobs/é"); err != nil {
		t.Fatal(err)
	}
	st, err := d.Read(c, "jobs/é")
	if err != nil {
		t.Fatal(err)
	}
	want := driver.State{Resource: "jobs/é", Epoch: 1, Generation: 3, Owner: "OWNER1", LeaseUntil: t0, PublishedEpoch: 1,
		PublishedGeneration: 2, PublishedAt: t0.Add(-time.Hour), SourceVersion: 9, PayloadSize: 5, CurrentEpoch: 2,
		Now: t0.Add(-time.Second)}
	if st != want || !st.Held() {
		t.Fatalf("read %+v\nwant %+v", st, want)
	}
	p, gen, err := d.ReadPayload(c, "jobs/é")
	if err != nil || gen != 2 || string(p) != "hello" {
		t.Fatalf("read payload: %q %d %v", p, gen, err)
	}
	calls := rec.Calls()
	wantCall(t, calls[0], "query", d.sql.procedure[opProvision], arg{"resource", "jobs/é"})
	wantCall(t, calls[1], "query", d.sql.procedure[opRead], arg{"resource", "jobs/é"})
	wantCall(t, calls[2], "query", d.sql.procedure[opReadPayload], arg{"resource", "jobs/é"})
}

func TestReadsOfAMissingRow(t *testing.T) {
	empty := []resultSet{{cols: []string{"x"}}}
	d, _ := newTestDriver(t, reply{sets: empty}, reply{sets: empty})
	if _, err := d.Read(ctxT(t), "r"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("read: %v", err)
	}
	if _, _, err := d.ReadPayload(ctxT(t), "r"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("read payload: %v", err)
	}
}

func TestProvisionDuplicateKeyIsSuccess(t *testing.T) {
	for _, n := range []int32{errDuplicateKey, errDuplicateKeyIdx} {
		d, _ := newTestDriver(t, reply{err: mssql.Error{Number: n, Message: "Violation of PRIMARY KEY constraint"}})
		if err := d.Provision(ctxT(t), "r"); err != nil {
			t.Fatalf("error %d: %v", n, err)
		}
	}
	d, _ := newTestDriver(t, reply{err: mssql.Error{Number: 8152, Message: "String or binary data would be truncated"}})
	if err := d.Provision(ctxT(t), "r"); err == nil || !strings.HasPrefix(err.Error(), "insert resource: ") {
		t.Fatalf("truncation: %v", err)
	}
}

func TestRollbacksAreRetriedABoundedNumberOfTimes(t *testing.T) {
	deadlock := reply{err: mssql.Error{Number: errDeadlockVictim, Class: 13, Message: "chosen as the deadlock victim"}}
	conflict := reply{err: mssql.Error{Number: errUpdateConflict, Class: 16, Message: "update conflict"}}

	d, rec := newTestDriver(t, deadlock, conflict, outputRows(1))
	if ok, err := d.Release(ctxT(t), lease); !ok || err != nil {
		t.Fatalf("release after two rollbacks: %v %v", ok, err)
	}
	if n := len(rec.Calls()); n != 3 {
		t.Fatalf("%d calls, want 3", n)
	}

	d, rec = newTestDriver(t, deadlock, deadlock, deadlock, reply{affected: 1})
	ok, err := d.Publish(ctxT(t), lease, driver.Publication{Payload: []byte("x"), OpID: "op"})
	var me mssql.Error
	if ok || !errors.Is(err, ErrRolledBack) || !errors.Is(err, driver.ErrNotApplied) || !errors.As(err, &me) ||
		me.Number != errDeadlockVictim {
		t.Fatalf("publish rolled back three times: %v %v", ok, err)
	}
	if !strings.HasPrefix(err.Error(), "update publication: rolled back by SQL Server: ") {
		t.Fatalf("message: %v", err)
	}
	if n := len(rec.Calls()); n != attempts {
		t.Fatalf("%d calls, want %d", n, attempts)
	}

	d, rec = newTestDriver(t, deadlock, reply{sets: acquireSets([]sqldriver.Value{int64(1), int64(1), t0, int64(1)})})
	if g, err := d.Acquire(ctxT(t), "r", "o", time.Minute); err != nil || g.Generation != 1 {
		t.Fatalf("acquire after a deadlock: %+v %v", g, err)
	}
	if n := len(rec.Calls()); n != 2 {
		t.Fatalf("%d calls, want 2", n)
	}

	// Any other SQL Server error is reported at once, wrapped, and is not a rollback.
	d, rec = newTestDriver(t, reply{err: mssql.Error{Number: 208, Class: 16, Message: "Invalid object name"}})
	_, _, err = d.Renew(ctxT(t), lease, time.Minute)
	if err == nil || errors.Is(err, ErrRolledBack) || !errors.As(err, &me) || me.Number != 208 {
		t.Fatalf("renew: %v", err)
	}
	if n := len(rec.Calls()); n != 1 {
		t.Fatalf("%d calls, want 1", n)
	}
}

func TestTrailingSpaceIsRefusedBeforeSending(t *testing.T) {
	d, rec := newTestDriver(t)
	c := ctxT(t)
	l := driver.LeaseRef{Resource: "r ", Owner: "o", Epoch: 1, Generation: 1}
	_, acqErr := d.Acquire(c, "r ", "o", time.Minute)
	_, _, renewErr := d.Renew(c, l, time.Minute)
	_, pubErr := d.Publish(c, l, driver.Publication{OpID: "op"})
	_, parErr := d.PublishAndRelease(c, l, driver.Publication{OpID: "op"})
	_, relErr := d.Release(c, l)
	_, readErr := d.Read(c, "r ")
	_, _, payErr := d.ReadPayload(c, "r ")
	for i, err := range []error{d.Provision(c, "r "), acqErr, renewErr, pubErr, parErr, relErr, readErr, payErr} {
		if !errors.Is(err, ErrTrailingSpace) {
			t.Errorf("operation %d: %v", i, err)
		}
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements sent", n)
	}
}

func TestBadTTLIsRefusedBeforeSending(t *testing.T) {
	d, rec := newTestDriver(t)
	if _, err := d.Acquire(ctxT(t), "r", "o", 0); err == nil {
		t.Fatal("acquire with a zero ttl")
	}
	if _, _, err := d.Renew(ctxT(t), lease, time.Duration(1<<62)); err == nil {
		t.Fatal("renew past DATEADD's range")
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements sent", n)
	}
}

func TestMigrateRunsInOneLockedTransaction(t *testing.T) {
	status := func(v int64) reply {
		return reply{sets: []resultSet{{cols: []string{"status"}, rows: [][]sqldriver.Value{{v}}}}}
	}
	version := func(v int64) reply {
		return reply{sets: []resultSet{{cols: []string{"v"}, rows: [][]sqldriver.Value{{v}}}}}
	}
	stale := func(ops ...op) reply {
		var rows [][]sqldriver.Value
		for _, o := range ops {
			rows = append(rows, []sqldriver.Value{int64(o)})
		}
		return reply{sets: []resultSet{{cols: []string{"n"}, rows: rows}}}
	}
	var all []op
	for o := range numOps {
		all = append(all, o)
	}
	names, _ := fs.Glob(migrations, "migrations/*.sql")
	replies := []reply{status(0), {}, {}, version(0)}
	for range names {
		replies = append(replies, reply{}, reply{})
	}
	replies = append(replies, reply{}, stale(all...))
	rec, db := newRecorder(t, replies...)
	d, err := NewWithConfig(db, &Config{Schema: "fenced_t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	calls := rec.Calls()
	if want := 5 + 2*len(names) + 2 + int(numOps) + 1; len(calls) != want {
		t.Fatalf("%d calls, want %d: %+v", len(calls), want, calls)
	}
	wantCall(t, calls[0], "begin", "")
	wantCall(t, calls[1], "query", sqlMigrationLock, arg{"lock", "fenced_migrate:fenced_t"}, arg{"timeout_ms", int32(60000)})
	wantCall(t, calls[2], "exec", sqlCreateSchema, arg{"schema", "fenced_t"})
	wantCall(t, calls[3], "exec", d.sql.createMigrations)
	wantCall(t, calls[4], "query", d.sql.schemaVersion)
	i := 5
	for v, name := range names {
		body, _ := migrations.ReadFile(name)
		wantCall(t, calls[i], "exec", d.sql.names.Replace(string(body)))
		wantCall(t, calls[i+1], "exec", d.sql.recordMigration, arg{"version", int32(v + 1)})
		i += 2
	}
	// A migration was applied: the incarnation is recorded, in a batch of its own, and the
	// procedures that are missing are installed, in the same transaction.
	wantCall(t, calls[i], "exec", d.sql.recordIncarnation)
	wantCall(t, calls[i+1], "query", d.sql.staleProcedures)
	for o := range numOps {
		wantCall(t, calls[i+2+int(o)], "exec", d.sql.create[o])
	}
	wantCall(t, calls[len(calls)-1], "commit", "")

	// Up to date, as a granted role finds it: nothing is applied, recorded or installed.
	rec, db = newRecorder(t, status(1), reply{}, reply{}, version(int64(len(names))), stale())
	d = New(db)
	if err := d.Migrate(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if calls := rec.Calls(); len(calls) != 7 || calls[5].query != d.sql.staleProcedures || calls[6].kind != "commit" {
		t.Fatalf("up to date: %+v", calls)
	}

	// Up to date but one procedure is from another version: only that one is replaced.
	rec, db = newRecorder(t, status(1), reply{}, reply{}, version(int64(len(names))), stale(opRenew))
	d = New(db)
	if err := d.Migrate(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if calls := rec.Calls(); len(calls) != 8 || calls[6].query != d.sql.create[opRenew] || calls[7].kind != "commit" {
		t.Fatalf("one stale procedure: %+v", calls)
	}

	// The lock timed out: roll back and say so.
	rec, db = newRecorder(t, status(-1))
	if err := New(db).Migrate(ctxT(t)); err == nil || !strings.Contains(err.Error(), "sp_getapplock returned -1") {
		t.Fatalf("lock timeout: %v", err)
	}
	if calls := rec.Calls(); calls[len(calls)-1].kind != "rollback" {
		t.Fatalf("no rollback: %+v", calls)
	}
}

func TestCloseLeavesACallersHandleOpen(t *testing.T) {
	_, db := newRecorder(t)
	if err := New(db).Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(ctxT(t)); err != nil {
		t.Fatalf("the caller's handle was closed: %v", err)
	}
}
