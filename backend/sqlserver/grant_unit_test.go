package sqlserver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"strings"
	"testing"

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
		batch := grantBatch(s, "app_locks", "fenced_app", level)
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

// TestGrantRefusesPrefixes: prefixes are not checked by the SQL Server procedures yet, so a
// grant that asks for them is refused before anything is sent, rather than granting more.
func TestGrantRefusesPrefixes(t *testing.T) {
	rec, db := newRecorder(t)
	d, err := NewWithConfig(db, &Config{Schema: "app_locks"})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Grant(context.Background(), "fenced_app", driver.GrantSpec{Prefixes: []string{"a/"}})
	if err == nil || !strings.Contains(err.Error(), "prefixes are not supported") {
		t.Fatalf("grant with prefixes: %v", err)
	}
	if calls := rec.Calls(); len(calls) != 0 {
		t.Fatalf("sent %+v", calls)
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
