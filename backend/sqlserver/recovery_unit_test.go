package sqlserver

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	mssql "github.com/microsoft/go-mssqldb"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// TestClassification: an error is "not applied" only when the batch provably did not take
// effect; everything that may have reached the server stays unknown, and nothing becomes a
// refusal.
func TestClassification(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		notApplied bool
	}{
		{"server error: rolled back under XACT_ABORT", mssql.Error{Number: 8152, Class: 16, Message: "truncated"}, true},
		{"server error as a pointer", &mssql.Error{Number: 547, Class: 16, Message: "constraint"}, true},
		{"deadlock victim", mssql.Error{Number: errDeadlockVictim, Class: 13, Message: "deadlock"}, true},
		{"fatal severity: the connection ended, maybe around a commit", mssql.Error{Number: 21, Class: 21, Message: "fatal"}, false},
		{"fatal severity among several", mssql.Error{Number: 3980, Class: 16, All: []mssql.Error{{Class: 20}, {Class: 16}}}, false},
		{"DONE_SRVERROR", mssql.ServerError{}, false},
		{"bad connection before sending", sqldriver.ErrBadConn, true},
		{"reply lost: EOF", io.EOF, false},
		{"reply lost: network", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, false},
		{"context ended after sending", context.Canceled, false},
		{"anything else", errors.New("something"), false},
		{"marked where it was known", driver.NotApplied(errors.New("dial")), true},
		// go-mssqldb's error for a DONE token that flagged an error the server did not send
		// (token.go, doneStruct.getError): nothing says what happened.
		{"error without a reason", mssql.Error{Message: "Request failed but didn't provide reason"}, false},
		{"number 0 with a severity", mssql.Error{Number: 0, Class: 16, Message: "?"}, false},
		{"numbered, but one of its errors is not", mssql.Error{Number: 547, Class: 16, All: []mssql.Error{{Number: 0}, {Number: 547, Class: 16}}}, false},
		{"severity 10 is a message, not an error", mssql.Error{Number: 50000, Class: 10}, false},
		{"compile error: the open transaction dies with the discarded connection", mssql.Error{Number: 208, Class: 16, Message: "Invalid object name"}, true},
		{"incarnation changed", mssql.Error{Number: errIncarnationChanged, Class: 16, Message: "restored"}, true},
		{"incarnation unreadable", mssql.Error{Number: errIncarnationHidden, Class: 16, Message: "grant VIEW ANY DATABASE"}, true},
		// database/sql's refusals of arguments, before the driver sees the call.
		{"database/sql: argument count", errors.New("sql: expected 0 arguments, got 4"), true},
		{"database/sql: argument type", fmt.Errorf("sql: converting argument $1 type: %w", errors.New("unsupported type")), true},
		{"looks alike but is not database/sql's", errors.New("mssql: sql: expected something"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := translate("update lease", tt.err)
			if errors.Is(got, driver.ErrNotApplied) != tt.notApplied {
				t.Fatalf("translate(%v) = %v; not applied %v, want %v", tt.err, got, !tt.notApplied, tt.notApplied)
			}
			if !strings.HasPrefix(got.Error(), "update lease: ") {
				t.Fatalf("message %q", got)
			}
		})
	}
}

// TestMutationsNotSentAreNotApplied: when no connection can be had, every mutation says it
// did not happen, and none is a refusal.
func TestMutationsNotSentAreNotApplied(t *testing.T) {
	d, rec := newTestDriver(t)
	rec.connectErr = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for what, err := range mutationErrors(ctxT(t), d) {
		if !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("%s: %v, want not applied", what, err)
		}
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements recorded", n)
	}
}

// TestMutationsWithALostReplyAreUnknown: an error while reading the reply is not "not
// applied", and not a refusal; the statement is not sent again.
func TestMutationsWithALostReplyAreUnknown(t *testing.T) {
	lost := &net.OpError{Op: "read", Err: io.ErrUnexpectedEOF}
	var replies []reply
	for range 8 {
		replies = append(replies, reply{err: lost})
	}
	d, rec := newTestDriver(t, replies...)
	errs := mutationErrors(ctxT(t), d)
	for what, err := range errs {
		if err == nil || errors.Is(err, driver.ErrNotApplied) || errors.Is(err, driver.ErrNotFound) {
			t.Errorf("%s: %v, want an unknown outcome", what, err)
		}
	}
	if n := len(rec.Calls()); n != len(errs) {
		t.Fatalf("%d statements sent for %d operations", n, len(errs))
	}
}

func mutationErrors(ctx context.Context, d *Driver) map[string]error {
	l := driver.LeaseRef{Resource: "r", Owner: "o", Epoch: 1, Generation: 1}
	pub := driver.Publication{Payload: []byte("p"), OpID: "op"}
	_, acqErr := d.Acquire(ctx, "r", "o", time.Minute)
	_, _, renewErr := d.Renew(ctx, l, time.Minute)
	_, pubErr := d.Publish(ctx, l, pub)
	_, parErr := d.PublishAndRelease(ctx, l, pub)
	_, relErr := d.Release(ctx, l)
	_, resErr := d.ResolveOperation(ctx, "op")
	_, bumpErr := d.BumpEpoch(ctx)
	return map[string]error{"provision": d.Provision(ctx, "r"), "acquire": acqErr, "renew": renewErr,
		"publish": pubErr, "publish and release": parErr, "release": relErr, "resolve": resErr, "bump": bumpErr}
}

// TestUnreachableServer runs go-mssqldb for real against a port where nothing listens: every
// mutation is a certain failure, and a store still opens (the core only logs a durability
// check that could not run, unless it is strict).
func TestUnreachableServer(t *testing.T) {
	d := openUnreachable(t)
	ctx := ctxT(t)
	for what, err := range mutationErrors(ctx, d) {
		if !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("%s: %v, want not applied", what, err)
		}
		// The server and the cause, once, in the user's terms (not go-mssqldb's nested dial error).
		if msg := err.Error(); !strings.HasPrefix(msg, "cannot connect to the SQL Server at 127.0.0.1:") ||
			!strings.HasSuffix(msg, ": connection refused") {
			t.Errorf("%s: %q, want \"cannot connect to the SQL Server at 127.0.0.1:PORT: connection refused\"", what, msg)
		}
	}
	s, err := fenced.New(ctx, d, &fenced.Config{SkipMigrate: true})
	if err != nil {
		t.Fatalf("open a store on an unreachable server: %v", err)
	}
	defer s.Close()
	l, err := s.LeaseFor("r", "owner", fenced.Token{Epoch: 1, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, acqErr := s.Acquire(ctx, "r", time.Minute)
	for what, err := range map[string]error{"acquire": acqErr, "publish": l.Publish(ctx, []byte("x")),
		"renew": l.Renew(ctx, time.Minute), "release": l.Release(ctx)} {
		if err == nil || errors.Is(err, fenced.ErrOutcomeUnknown) || errors.Is(err, fenced.ErrRefused) || errors.Is(err, fenced.ErrBusy) {
			t.Errorf("%s: %v, want a certain failure", what, err)
		}
	}
}

// openUnreachable opens a driver on a loopback port where nothing listens.
func openUnreachable(t *testing.T) *Driver {
	d, err := Open("sqlserver://sa:pw@" + drivertest.ClosedAddr(t) + "?database=fenced&dial+timeout=2&connection+timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestIncarnationChangedIsReported: the incarnation check's error number becomes
// driver.ErrIncarnationChanged (not applied) for every lease-carrying call, which the core
// turns into fenced.ErrIncarnationChanged; the unreadable incarnation (51802) does not.
func TestIncarnationChangedIsReported(t *testing.T) {
	changed := reply{err: mssql.Error{Number: errIncarnationChanged, Class: 16, State: 1,
		Message: "fenced: the database was restored since the last epoch bump; bump the epoch"}}
	var replies []reply
	for range 8 {
		replies = append(replies, changed)
	}
	d, _ := newTestDriver(t, replies...)
	errs := mutationErrors(ctxT(t), d)
	for _, what := range []string{"acquire", "renew", "publish", "publish and release", "release"} {
		if err := errs[what]; !errors.Is(err, driver.ErrIncarnationChanged) || !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("%s: %v", what, err)
		}
	}
	disabled := reply{sets: []resultSet{{cols: []string{"d"}, rows: [][]sqldriver.Value{{"DISABLED"}}}}}
	d, _ = newTestDriver(t, disabled, changed)
	s, err := fenced.New(ctxT(t), d, &fenced.Config{SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Acquire(ctxT(t), "r", time.Minute); !errors.Is(err, fenced.ErrIncarnationChanged) {
		t.Fatalf("store acquire: %v", err)
	}
	hidden := translate("update lease", mssql.Error{Number: errIncarnationHidden, Class: 16})
	if errors.Is(hidden, driver.ErrIncarnationChanged) || !errors.Is(hidden, driver.ErrNotApplied) {
		t.Fatalf("unreadable incarnation: %v", hidden)
	}
}

// TestConnectionIsDiscardedAfterAnError: after any error from a call the physical connection
// is closed, not pooled, so that a transaction a compile error left open (XACT_ABORT does not
// cover those) dies with it; after a success it is kept.
func TestConnectionIsDiscardedAfterAnError(t *testing.T) {
	compile := reply{err: mssql.Error{Number: 208, Class: 16, Message: "Invalid object name 'fenced_operations'"}}
	d, rec := newTestDriver(t, count(1), compile, count(1))
	c := ctxT(t)
	pub := driver.Publication{Payload: []byte("p\x00q"), OpID: "op"}
	if ok, err := d.Publish(c, lease, pub); !ok || err != nil {
		t.Fatalf("publish: %v %v", ok, err)
	}
	if connects, closes := rec.Counts(); connects != 1 || closes != 0 {
		t.Fatalf("after a success: %d connects, %d closes", connects, closes)
	}
	if _, err := d.Publish(c, lease, pub); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("publish after a compile error: %v", err)
	}
	if connects, closes := rec.Counts(); connects != 1 || closes != 1 {
		t.Fatalf("after an error: %d connects, %d closes; want the connection closed", connects, closes)
	}
	if ok, err := d.Publish(c, lease, pub); !ok || err != nil {
		t.Fatalf("publish on a new connection: %v %v", ok, err)
	}
	if connects, closes := rec.Counts(); connects != 2 || closes != 1 {
		t.Fatalf("next call: %d connects, %d closes; want a new connection", connects, closes)
	}
}

// TestArgumentErrorsAreNotApplied: database/sql refuses the arguments before go-mssqldb sees
// the call; the operation did not happen.
func TestArgumentErrorsAreNotApplied(t *testing.T) {
	d, rec := newTestDriver(t)
	rec.checkErr = errors.New("unsupported type")
	for what, err := range mutationErrors(ctxT(t), d) {
		if !errors.Is(err, driver.ErrNotApplied) || !strings.Contains(err.Error(), "sql: converting argument") {
			if what == "bump" { // takes no arguments: the recorder answers it
				continue
			}
			t.Errorf("%s: %v, want not applied", what, err)
		}
	}
}

// TestLegacyDriverNameIsRefused: a handle opened with the "mssql" name (go-mssqldb's
// placeholder-rewriting instance) is refused before anything is sent; one opened with
// "sqlserver" is accepted.
func TestLegacyDriverNameIsRefused(t *testing.T) {
	dsn := "sqlserver://sa:pw@" + drivertest.ClosedAddr(t) + "?database=fenced&dial+timeout=1"
	legacy, err := sql.Open("mssql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer legacy.Close()
	if _, err := NewWithConfig(legacy, nil); !errors.Is(err, ErrLegacyDriver) {
		t.Fatalf("NewWithConfig over mssql: %v", err)
	}
	d := New(legacy)
	c := ctxT(t)
	if err := d.Migrate(c); !errors.Is(err, ErrLegacyDriver) {
		t.Fatalf("migrate: %v", err)
	}
	for what, err := range mutationErrors(c, d) {
		if !errors.Is(err, ErrLegacyDriver) || !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("%s: %v", what, err)
		}
	}
	if err := d.Grant(c, "r", driver.GrantSpec{}); !errors.Is(err, ErrLegacyDriver) {
		t.Fatalf("grant: %v", err)
	}
	if _, err := fenced.New(c, d, nil); !errors.Is(err, ErrLegacyDriver) {
		t.Fatalf("store: %v", err)
	}
	modern, err := sql.Open("sqlserver", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer modern.Close()
	if _, err := NewWithConfig(modern, nil); err != nil {
		t.Fatalf("NewWithConfig over sqlserver: %v", err)
	}
	connector, err := mssql.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	viaConnector := sql.OpenDB(connector)
	defer viaConnector.Close()
	if _, err := NewWithConfig(viaConnector, nil); err != nil {
		t.Fatalf("NewWithConfig over mssql.NewConnector: %v", err)
	}
}

// TestFailedPruneIsNeverNotApplied: a prune commits batch by batch, so an error after sending
// may follow deleted batches; only a failure to connect says nothing was deleted.
func TestFailedPruneIsNeverNotApplied(t *testing.T) {
	d, rec := newTestDriver(t, reply{err: mssql.Error{Number: 1205, Class: 13, Message: "deadlock"}},
		reply{err: mssql.Error{Number: 1205, Class: 13}}, reply{err: mssql.Error{Number: 1205, Class: 13}})
	_, err := d.PruneOperations(ctxT(t), time.Hour)
	if err == nil || errors.Is(err, driver.ErrNotApplied) || !strings.Contains(err.Error(), "some records may have been deleted") {
		t.Fatalf("prune: %v", err)
	}
	rec.connectErr = errors.New("dial: refused")
	if _, err := d.PruneOperations(ctxT(t), time.Hour); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("prune without a connection: %v", err)
	}
}

func TestCheckDurability(t *testing.T) {
	setting := func(v string) reply {
		return reply{sets: []resultSet{{cols: []string{"delayed_durability_desc"}, rows: [][]sqldriver.Value{{v}}}}}
	}
	d, rec := newTestDriver(t, setting("DISABLED"), setting("FORCED"), setting("ALLOWED"), reply{err: errors.New("no route")})
	c := ctxT(t)
	if w, err := d.CheckDurability(c); err != nil || len(w) != 0 {
		t.Fatalf("DISABLED: %v, %v", w, err)
	}
	for _, want := range []string{"DELAYED_DURABILITY is FORCED", "DELAYED_DURABILITY is ALLOWED"} {
		w, err := d.CheckDurability(c)
		if err != nil || len(w) != 1 || !strings.Contains(w[0], want) {
			t.Fatalf("got %v, %v; want a warning containing %q", w, err, want)
		}
	}
	if w, err := d.CheckDurability(c); err == nil || len(w) != 0 || err.Error() != "read delayed durability: no route" {
		t.Fatalf("unreadable setting: %v, %v; want the error", w, err)
	}
	for _, c := range rec.Calls() {
		wantCall(t, c, "query", "SELECT delayed_durability_desc FROM sys.databases WHERE database_id = DB_ID()")
	}
}

// staleReply answers staleProcedures with ops.
func staleReply(ops ...op) reply {
	var rows [][]sqldriver.Value
	for _, o := range ops {
		rows = append(rows, []sqldriver.Value{int64(o)})
	}
	return reply{sets: []resultSet{{cols: []string{"n"}, rows: rows}}}
}

func TestGrantSendsProceduresThenPermissions(t *testing.T) {
	var all []op
	for o := range numOps {
		all = append(all, o)
	}
	rec, db := newRecorder(t, staleReply(all...))
	d, err := NewWithConfig(db, &Config{Schema: "app_locks"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Grant(ctxT(t), "fenced_app", driver.GrantSpec{Access: driver.AccessAdmin}); err != nil {
		t.Fatal(err)
	}
	calls := rec.Calls()
	if len(calls) != int(numOps)+4 {
		t.Fatalf("%d calls: %+v", len(calls), calls)
	}
	wantCall(t, calls[0], "begin", "")
	wantCall(t, calls[1], "query", d.sql.staleProcedures)
	calls = calls[1:]
	for o := range numOps {
		wantCall(t, calls[1+int(o)], "exec", d.sql.create[o])
	}
	want := `SET XACT_ABORT ON;
IF EXISTS (SELECT 1 FROM sys.database_principals
           WHERE name = @role AND (principal_id < 5 OR is_fixed_role = 1))
    THROW 50000, N'fenced grant: refusing to restrict a built-in database principal', 1;
IF DATABASE_PRINCIPAL_ID(@role) IS NULL
    CREATE ROLE [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_provision] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_acquire] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_renew] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_publish] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_publish_and_release] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_release] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_read] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_read_payload] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_resolve] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_read_operation] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_bump_epoch] TO [fenced_app];
GRANT EXECUTE ON OBJECT::[app_locks].[fenced_prune_operations] TO [fenced_app];
GRANT SELECT ON OBJECT::[app_locks].[fenced_schema_migrations] TO [fenced_app];
GRANT VIEW DEFINITION ON SCHEMA::[app_locks] TO [fenced_app];
DENY INSERT, UPDATE, DELETE ON OBJECT::[app_locks].[fenced_resources] TO [fenced_app];
DENY INSERT, UPDATE, DELETE ON OBJECT::[app_locks].[fenced_meta] TO [fenced_app];
DENY INSERT, UPDATE, DELETE ON OBJECT::[app_locks].[fenced_operations] TO [fenced_app];
DENY INSERT, UPDATE, DELETE ON OBJECT::[app_locks].[fenced_schema_migrations] TO [fenced_app];
DENY INSERT, UPDATE, DELETE ON OBJECT::[app_locks].[fenced_grants] TO [fenced_app];
DENY ALTER ON SCHEMA::[app_locks] TO [fenced_app];
DELETE FROM [app_locks].[fenced_grants] WHERE role_name = @role;
INSERT INTO [app_locks].[fenced_grants] (role_name, prefix) VALUES (@role, @prefix0);`
	wantCall(t, calls[numOps+1], "exec", want, arg{"role", "fenced_app"}, arg{"prefix0", ""})
	wantCall(t, calls[numOps+2], "commit", "")

	// A failure rolls everything back.
	rec, db = newRecorder(t, staleReply(opAcquire), reply{err: mssql.Error{Number: 262, Class: 14, Message: "CREATE PROCEDURE permission denied"}})
	d, err = NewWithConfig(db, &Config{Schema: "app_locks"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Grant(ctxT(t), "fenced_app", driver.GrantSpec{Access: driver.AccessAdmin}); err == nil || !strings.Contains(err.Error(), "create procedure fenced_acquire") {
		t.Fatalf("grant without permission: %v", err)
	}
	if calls := rec.Calls(); calls[len(calls)-1].kind != "rollback" {
		t.Fatalf("no rollback: %+v", calls)
	}
}

// TestGrantRefusesSchemaDBO: DENY ALTER ON SCHEMA::dbo would deny the role every change of
// definition in dbo, so Grant refuses before sending anything and names the fix.
func TestGrantRefusesSchemaDBO(t *testing.T) {
	rec, db := newRecorder(t)
	for _, d := range []*Driver{New(db), must(NewWithConfig(db, &Config{Schema: "DBO"}))} {
		err := d.Grant(ctxT(t), "fenced_app", driver.GrantSpec{Access: driver.AccessAdmin})
		if !errors.Is(err, ErrGrantInDBO) || !strings.Contains(err.Error(), "schema of its own") {
			t.Errorf("grant on %s: %v", d.Schema(), err)
		}
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements sent", n)
	}
}

func must(d *Driver, err error) *Driver {
	if err != nil {
		panic(err)
	}
	return d
}

func TestGrantRefusesBadRoleNames(t *testing.T) {
	rec, db := newRecorder(t)
	d := must(NewWithConfig(db, &Config{Schema: "app"}))
	for _, role := range []string{"", "a]b", "a b", "1role", "x;DROP TABLE y", "[r]", "é", strings.Repeat("r", 64)} {
		if err := d.Grant(ctxT(t), role, driver.GrantSpec{Access: driver.AccessAdmin}); err == nil {
			t.Errorf("role %q accepted", role)
		}
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements sent", n)
	}
}

func TestQuoteName(t *testing.T) {
	for in, want := range map[string]string{"dbo": "[dbo]", "a]b": "[a]]b]", "]]": "[]]]]]", "a[b": "[a[b]"} {
		if got := quoteName(in); got != want {
			t.Errorf("quoteName(%q) = %q, want %q", in, got, want)
		}
	}
}
