package sqlserver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	mssql "github.com/microsoft/go-mssqldb"

	"github.com/fenced-dev/fenced/driver"
)

// TestGrantBatchLevels: each level grants EXECUTE on the procedures it includes and revokes it
// on the others (so that granting again with a lower level takes rights away), and every level
// keeps the DENYs on the tables. No server here: the batch's text is checked.
func TestGrantBatchLevels(t *testing.T) {
	s := newStatements("app_locks")
	want := map[driver.Access]map[op]bool{
		driver.AccessReader: {opRead: true, opReadPayload: true, opReadOperation: true},
		driver.AccessWorker: {opRead: true, opReadPayload: true, opReadOperation: true,
			opAcquire: true, opRenew: true, opPublish: true, opPublishAndRelease: true, opRelease: true, opResolve: true},
		driver.AccessAdmin: {},
	}
	for o := range numOps {
		want[driver.AccessAdmin][o] = true
	}
	for level, granted := range want {
		batch := grantBatch(s, "app_locks", "fenced_app", level, 1)
		for o := range numOps {
			grant := "GRANT EXECUTE ON OBJECT::" + s.procedure[o] + " TO [fenced_app];"
			revoke := "REVOKE EXECUTE ON OBJECT::" + s.procedure[o] + " FROM [fenced_app];"
			if granted[o] != strings.Contains(batch, grant) || granted[o] == strings.Contains(batch, revoke) {
				t.Errorf("%s: %s granted %v, want %v:\n%s", level, routines[o].procedure, !granted[o], granted[o], batch)
			}
		}
		for _, tb := range tables {
			if !strings.Contains(batch, "DENY INSERT, UPDATE, DELETE ON OBJECT::"+s.table[tb.name]+" TO [fenced_app];") {
				t.Errorf("%s: no DENY on %s", level, tb.name)
			}
		}
	}
}

// TestGrantWritesPrefixesInItsTransaction: the prefixes go in the same batch as the rights,
// inside Grant's one transaction, after a DELETE of the role's earlier rows, so that granting
// again replaces them (what the new grant does not list is gone); a failure rolls it all back.
// No server here: the calls and the batch's text are checked.
func TestGrantWritesPrefixesInItsTransaction(t *testing.T) {
	rec, db := newRecorder(t)
	d, err := NewWithConfig(db, &Config{Schema: "app_locks"})
	if err != nil {
		t.Fatal(err)
	}
	spec := driver.GrantSpec{Access: driver.AccessWorker, Prefixes: []string{"ü/", "a%_[x ", "a%_[x  z", "ü/"}}
	if err := d.Grant(ctxT(t), "fenced_app", spec); err != nil {
		t.Fatal(err)
	}
	calls := rec.Calls()
	if len(calls) != 4 || calls[0].kind != "begin" || calls[3].kind != "commit" {
		t.Fatalf("want begin, find stale procedures, the grant batch, commit: %+v", calls)
	}
	table := "[app_locks].[fenced_grants]"
	tail := "DENY ALTER ON SCHEMA::[app_locks] TO [fenced_app];\n" +
		"DELETE FROM " + table + " WHERE role_name = @role;\n" +
		"INSERT INTO " + table + " (role_name, prefix) VALUES (@role, @prefix0);\n" +
		"INSERT INTO " + table + " (role_name, prefix) VALUES (@role, @prefix1);"
	batch := grantBatch(d.sql, "app_locks", "fenced_app", driver.AccessWorker, 2)
	if !strings.HasSuffix(batch, tail) || !strings.HasPrefix(batch, "SET XACT_ABORT ON;") {
		t.Errorf("batch:\n%s", batch)
	}
	wantCall(t, calls[2], "exec", batch, arg{"role", "fenced_app"}, arg{"prefix0", "a%_[x "}, arg{"prefix1", "ü/"})

	// Granted again with other prefixes: the same DELETE, then only the new rows.
	rec, db = newRecorder(t)
	d = must(NewWithConfig(db, &Config{Schema: "app_locks"}))
	if err := d.Grant(ctxT(t), "fenced_app", driver.GrantSpec{Access: driver.AccessWorker, Prefixes: []string{"c/"}}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, rec.Calls()[2], "exec", grantBatch(d.sql, "app_locks", "fenced_app", driver.AccessWorker, 1),
		arg{"role", "fenced_app"}, arg{"prefix0", "c/"})

	// The batch fails (say the INSERT): Grant rolls back, rights and prefixes together.
	rec, db = newRecorder(t, reply{}, reply{err: mssql.Error{Number: 2627, Class: 14, Message: "Violation of PRIMARY KEY constraint"}})
	d = must(NewWithConfig(db, &Config{Schema: "app_locks"}))
	if err := d.Grant(ctxT(t), "fenced_app", spec); err == nil {
		t.Fatal("grant whose batch failed succeeded")
	}
	if calls := rec.Calls(); calls[len(calls)-1].kind != "rollback" {
		t.Fatalf("no rollback: %+v", calls)
	}
}

// TestPrefixRows: what Grant writes for the prefixes asked for. LIKE's wildcards and trailing
// spaces are kept as they are; a prefix that another begins is dropped (it allows nothing
// more, and "a" and "a " would be one key to SQL Server's = on NVARCHAR); "a_" does not cover
// "ab" (the _ is a character, not a wildcard); too many or too long is refused, nothing sent.
func TestPrefixRows(t *testing.T) {
	for _, c := range []struct {
		in, want []string
	}{
		{nil, []string{""}},
		{[]string{"a%"}, []string{"a%"}},
		{[]string{"a ", "a"}, []string{"a"}},
		{[]string{"a  ", "a "}, []string{"a "}},
		{[]string{"ab", "a_", "a[b]", "%"}, []string{"%", "a[b]", "a_", "ab"}},
		{[]string{"reports/", "reports/2024 ", "Reports/"}, []string{"Reports/", "reports/"}},
		{[]string{"ü/", "ü/ä b", "u/"}, []string{"u/", "ü/"}},
		{[]string{strings.Repeat("é", resourceMax)}, []string{strings.Repeat("é", resourceMax)}},
	} {
		got, err := prefixRows(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("prefixRows(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range [][]string{
		{strings.Repeat("a", resourceMax+1)},
		{strings.Repeat("😀", resourceMax/2+1)}, // two UTF-16 code units each
		make([]string, maxPrefixes+1),
	} {
		if _, err := prefixRows(in); err == nil {
			t.Errorf("prefixRows accepted %d prefixes of up to %d bytes", len(in), len(in[0]))
		}
	}
	rec, db := newRecorder(t)
	d := must(NewWithConfig(db, &Config{Schema: "app"}))
	err := d.Grant(ctxT(t), "fenced_app", driver.GrantSpec{Prefixes: []string{strings.Repeat("p", 300)}})
	if err == nil || !strings.Contains(err.Error(), "longer than a resource name can be") {
		t.Fatalf("grant with a 300-character prefix: %v", err)
	}
	if n := len(rec.Calls()); n != 0 {
		t.Fatalf("%d statements sent", n)
	}
}

// TestEveryResourceProcedureChecksPrefixes: each procedure that takes a resource - those a
// worker or reader calls with one, and provision - runs prefixCheck against this schema's
// fenced_grants right after its session settings, before the incarnation check and before
// it reads or locks a row; Resolve, ReadOperation, BumpEpoch and Prune take no resource and
// do not. The check compares bytes: no LIKE, no LEN, no = on the strings.
func TestEveryResourceProcedureChecksPrefixes(t *testing.T) {
	s := newStatements("app")
	check := s.names.Replace(prefixCheck)
	want := map[op]bool{opProvision: true, opAcquire: true, opRenew: true, opPublish: true,
		opPublishAndRelease: true, opRelease: true, opRead: true, opReadPayload: true}
	for o := range numOps {
		i := strings.Index(s.create[o], check)
		if (i >= 0) != want[o] {
			t.Errorf("%s: prefix check present %v, want %v", routines[o].procedure, i >= 0, want[o])
			continue
		}
		if i < 0 {
			continue
		}
		head := s.create[o][:i]
		if !strings.HasSuffix(head, autocommit) && !strings.HasSuffix(head, autocommit+writes) {
			t.Errorf("%s: the check does not follow the session settings:\n%s", routines[o].procedure, s.create[o])
		}
		if strings.Contains(head, "[app].[fenced_resources]") || strings.Contains(head, "recovery_status") {
			t.Errorf("%s: reads before the check:\n%s", routines[o].procedure, s.create[o])
		}
	}
	for _, w := range []string{
		"FROM [app].[fenced_grants] WHERE IS_MEMBER(role_name) = 1",
		"IS_MEMBER(N'db_owner') = 0",
		"DATALENGTH(@resource) >= DATALENGTH(prefix)",
		"SUBSTRING(CAST(@resource AS VARBINARY(8000)), 1, DATALENGTH(prefix)) = CAST(prefix AS VARBINARY(510))",
		"THROW 51803, @outside, 1;",
		"USER_NAME()",
	} {
		if !strings.Contains(check, w) {
			t.Errorf("the check lacks %q:\n%s", w, check)
		}
	}
	for _, w := range []string{"LIKE", "LEN(", "LEFT(", "CONTEXT_INFO", "SESSION_CONTEXT", "#"} {
		if strings.Contains(check, w) {
			t.Errorf("the check uses %q:\n%s", w, check)
		}
	}
	if fmt.Sprint(errOutsidePrefixes) != "51803" {
		t.Errorf("errOutsidePrefixes is %d, the check throws 51803", errOutsidePrefixes)
	}
	body, err := migrations.ReadFile("migrations/0004_grants.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"CREATE TABLE [app].[fenced_grants]", "prefix    NVARCHAR(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
		"PRIMARY KEY (role_name, prefix)"} {
		if !strings.Contains(s.names.Replace(string(body)), w) {
			t.Errorf("migration 4 lacks %q", w)
		}
	}
}

// TestOutsidePrefixesIsPermissionError: the check's 51803 becomes a *driver.PermissionError
// (fenced.ErrPermissionDenied, exit 8 in the CLI) naming the operation, the database user and
// the resource, not applied, for each operation that takes a resource; it is not retried.
func TestOutsidePrefixesIsPermissionError(t *testing.T) {
	const resource = "b/x ü"
	lease := driver.LeaseRef{Resource: resource, Owner: "o", Generation: 3, Epoch: 7}
	for name, c := range map[string]struct {
		words string
		call  func(context.Context, *Driver) error
	}{
		"acquire": {"acquire", func(ctx context.Context, d *Driver) error {
			_, err := d.Acquire(ctx, resource, "o", time.Minute)
			return err
		}},
		"renew": {"renew", func(ctx context.Context, d *Driver) error {
			_, _, err := d.Renew(ctx, lease, time.Minute)
			return err
		}},
		"publish": {"publish", func(ctx context.Context, d *Driver) error {
			_, err := d.Publish(ctx, lease, driver.Publication{Payload: []byte{0, 1}, OpID: "op"})
			return err
		}},
		"release": {"release", func(ctx context.Context, d *Driver) error {
			_, err := d.Release(ctx, lease)
			return err
		}},
		"read": {"read", func(ctx context.Context, d *Driver) error {
			_, err := d.Read(ctx, resource)
			return err
		}},
		"provision": {"provision", func(ctx context.Context, d *Driver) error { return d.Provision(ctx, resource) }},
	} {
		outside := reply{err: mssql.Error{Number: errOutsidePrefixes, Class: 16,
			Message: "fenced: role fenced_app may not use resource b/x ü: it is outside the prefixes the role was granted"}}
		user := reply{sets: []resultSet{{cols: []string{"u"}, rows: [][]sqldriver.Value{{"fenced_app"}}}}}
		d, rec := newTestDriver(t, outside, user)
		err := c.call(ctxT(t), d)
		var pe *driver.PermissionError
		if !errors.As(err, &pe) || !errors.Is(err, driver.ErrPermission) || !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("%s outside the prefixes: %v", name, err)
			continue
		}
		if want := `role fenced_app may not ` + c.words + ` "b/x ü": the resource is outside the prefixes it was granted`; !strings.Contains(err.Error(), want) {
			t.Errorf("%s: message %q, want %q", name, err, want)
		}
		if n := len(rec.Calls()); n != 2 {
			t.Errorf("%s: %d calls, want the procedure and USER_NAME(): %+v", name, n, rec.Calls())
		}
	}
}

// TestPermissionDeniedNamesOperationAndRole: SQL Server's 229 on a procedure the role was not
// granted becomes a *driver.PermissionError naming the operation and the database user, not
// applied.
func TestPermissionDeniedNamesOperationAndRole(t *testing.T) {
	denied := reply{err: mssql.Error{Number: errPermissionDenied, Class: 14,
		Message: "The EXECUTE permission was denied on the object 'fenced_bump_epoch'"}}
	user := reply{sets: []resultSet{{cols: []string{"u"}, rows: [][]sqldriver.Value{{"fenced_app"}}}}}
	d, _ := newTestDriver(t, denied, user)
	_, err := d.BumpEpoch(context.Background())
	var pe *driver.PermissionError
	if !errors.As(err, &pe) || !errors.Is(err, driver.ErrNotApplied) || !errors.Is(err, driver.ErrPermission) {
		t.Fatalf("bump refused for lack of rights: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "role fenced_app may not bump the epoch") {
		t.Fatalf("message %q", msg)
	}
}
