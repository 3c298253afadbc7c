package mysql_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/driver"
)

// adminGrant gives every operation, as the conformance suite needs (it provisions and bumps).
var adminGrant = &fenced.GrantOptions{Access: fenced.AccessAdmin}

// newUser creates an account with a password, dropped when t ends, and returns its name and a
// URL of dbURL that connects as it.
func newUser(t *testing.T, admin *mysql.Driver, dbURL string) (string, string) {
	t.Helper()
	role := "fenced_role_" + strings.ToLower(rand.Text()[:12])
	password := rand.Text()
	if _, err := admin.DB().ExecContext(testCtx(t), "CREATE USER '"+role+"'@'%' IDENTIFIED BY '"+password+"'"); err != nil {
		t.Fatalf("create user: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.DB().ExecContext(ctx, "DROP USER IF EXISTS '"+role+"'@'%'"); err != nil {
			t.Errorf("drop user %s: %v", role, err)
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return role, u.String()
}

func wantPermission(t *testing.T, what string, err error, role, op string) {
	t.Helper()
	var pe *driver.PermissionError
	if !errors.Is(err, fenced.ErrPermissionDenied) || !errors.As(err, &pe) || !errors.Is(err, driver.ErrNotApplied) {
		t.Errorf("%s as %s: %v, want permission denied", what, role, err)
		return
	}
	if msg := err.Error(); !strings.Contains(msg, role) || !strings.Contains(msg, op) {
		t.Errorf("%s: %q does not name the role %s and the operation %q", what, msg, role, op)
	}
}

// wantDeniedSQL: the server itself refuses the statement to the account.
func wantDeniedSQL(t *testing.T, d *mysql.Driver, q string, want uint16) {
	t.Helper()
	_, err := d.DB().ExecContext(testCtx(t), q)
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || me.Number != want {
		t.Errorf("%s: %v, want error %d", q, err, want)
	}
}

// TestGrantLevels: a reader, a worker and an admin account on one store, after an epoch bump,
// and again after the admin account bumped it. Each may do what its level includes; the rest
// is refused by the server, through the store (one sentence naming the account and the
// operation, nothing changed) and as a direct CALL. Granting again with another level revokes
// what the new level does not include.
func TestGrantLevels(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	if _, err := ownerStore.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	const resource = "team a/ü build"
	if err := ownerStore.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	reader, readerURL := newUser(t, owner, dbURL)
	worker, workerURL := newUser(t, owner, dbURL)
	admin, adminURL := newUser(t, owner, dbURL)
	for role, a := range map[string]fenced.Access{reader: fenced.AccessReader, worker: fenced.AccessWorker, admin: fenced.AccessAdmin} {
		if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Access: a}); err != nil {
			t.Fatal(err)
		}
	}
	epochNow := func() int64 {
		st, err := ownerStore.Show(ctx, resource)
		if err != nil {
			t.Fatal(err)
		}
		return st.CurrentEpoch
	}
	for round := range 2 {
		opID := fmt.Sprintf("op-%d-%s", round, worker)
		wd := open(t, workerURL)
		ws := newStore(t, wd)
		l, err := ws.Acquire(ctx, resource, time.Minute)
		if err != nil {
			t.Fatalf("round %d: worker acquire: %v", round, err)
		}
		if l.Epoch() == l.Generation() {
			t.Fatal("epoch equals generation: the test would not tell them apart")
		}
		if err := l.Renew(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := l.Publish(ctx, []byte("a\x00b"), fenced.WithOpID(opID)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ws.Get(ctx, resource); err != nil {
			t.Fatal(err)
		}
		if _, err := ws.Resolve(ctx, "unknown-"+opID); err != nil {
			t.Fatal(err)
		}
		before := epochNow()
		_, err = ws.BumpEpoch(ctx)
		wantPermission(t, "worker bump", err, worker, "bump the epoch")
		if epochNow() != before {
			t.Fatal("a refused bump changed the epoch")
		}
		_, err = ws.PruneOperations(ctx, ws.MinPruneAge())
		wantPermission(t, "worker prune", err, worker, "prune")
		wantPermission(t, "worker provision", ws.Provision(ctx, "new one"), worker, "provision")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wantDeniedSQL(t, wd, "CALL fenced_bump_epoch()", 1370)
		wantDeniedSQL(t, wd, "CALL fenced_prune_operations(0)", 1370)
		wantDeniedSQL(t, wd, "CALL fenced_provision('x')", 1370)
		wantDeniedSQL(t, wd, "UPDATE fenced_meta SET epoch = epoch + 1", 1142)
		wantDeniedSQL(t, wd, "INSERT INTO fenced_grants (grantee, prefix) VALUES ('x', '')", 1142)

		rd := open(t, readerURL)
		rs := newStore(t, rd)
		st, err := rs.Show(ctx, resource)
		if err != nil || st.PublishedGeneration != l.Generation() {
			t.Fatalf("reader show: %+v, %v", st, err)
		}
		if got, _, err := rs.Get(ctx, resource); err != nil || string(got) != "a\x00b" {
			t.Fatalf("reader get: %q, %v", got, err)
		}
		if r, found, err := rs.LookupOperation(ctx, opID); err != nil || !found || !r.Accepted {
			t.Fatalf("reader lookup: %+v %v %v", r, found, err)
		}
		_, err = rs.Acquire(ctx, resource, time.Minute)
		wantPermission(t, "reader acquire", err, reader, "acquire")
		_, err = rs.Resolve(ctx, "reader-"+opID)
		wantPermission(t, "reader resolve", err, reader, "resolve")
		_, err = rs.BumpEpoch(ctx)
		wantPermission(t, "reader bump", err, reader, "bump the epoch")
		if after, err := ownerStore.Show(ctx, resource); err != nil || after.Generation != st.Generation || after.Owner != "" {
			t.Fatalf("a refused acquisition changed the row: %+v, %v", after, err)
		}
		if _, found, err := ownerStore.LookupOperation(ctx, "reader-"+opID); err != nil || found {
			t.Fatalf("a refused resolve recorded the id: %v, %v", found, err)
		}
		wantDeniedSQL(t, rd, "CALL fenced_acquire('o', 1000000, 'x')", 1370)
		wantDeniedSQL(t, rd, "CALL fenced_resolve('x')", 1370)
		wantDeniedSQL(t, rd, "CALL fenced_release('x', 'o', 1, 1)", 1370)

		as := newStore(t, open(t, adminURL))
		if err := as.Provision(ctx, "admin's ü"); err != nil {
			t.Fatal(err)
		}
		if _, err := as.PruneOperations(ctx, as.MinPruneAge()); err != nil {
			t.Fatal(err)
		}
		if _, err := as.BumpEpoch(ctx); err != nil {
			t.Fatal(err)
		}
	}

	if err := ownerStore.Grant(ctx, admin, &fenced.GrantOptions{Access: fenced.AccessWorker}); err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.Grant(ctx, worker, &fenced.GrantOptions{Access: fenced.AccessReader}); err != nil {
		t.Fatal(err)
	}
	ad := open(t, adminURL)
	_, err := newStore(t, ad).BumpEpoch(ctx)
	wantPermission(t, "admin granted again as worker: bump", err, admin, "bump the epoch")
	wantDeniedSQL(t, ad, "CALL fenced_bump_epoch()", 1370)
	wd := open(t, workerURL)
	_, err = newStore(t, wd).Acquire(ctx, resource, time.Minute)
	wantPermission(t, "worker granted again as reader: acquire", err, worker, "acquire")
}

// TestGrantPrefixes: a worker limited to "a/" and "ü/" acquires there and cannot acquire or
// read "b/x" or "a": the procedure refuses and the row does not change.
func TestGrantPrefixes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	if _, err := ownerStore.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.Provision(ctx, "a/x", "ü/y z", "b/x", "a"); err != nil {
		t.Fatal(err)
	}
	role, roleURL := newUser(t, owner, dbURL)
	if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Prefixes: []string{"a/", "ü/"}}); err != nil {
		t.Fatal(err)
	}
	d := open(t, roleURL)
	s := newStore(t, d)
	for _, r := range []string{"a/x", "ü/y z"} {
		l, err := s.Acquire(ctx, r, time.Minute)
		if err != nil {
			t.Fatalf("acquire %s within the prefixes: %v", r, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before, err := ownerStore.Show(ctx, "b/x")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"b/x", "a"} {
		_, err := s.Acquire(ctx, r, time.Minute)
		wantPermission(t, "acquire "+r, err, role, "acquire")
		var pe *driver.PermissionError
		if errors.As(err, &pe) && pe.Resource != r {
			t.Errorf("the refusal names %q, want %q", pe.Resource, r)
		}
	}
	_, err = s.Show(ctx, "b/x")
	wantPermission(t, "show b/x", err, role, "read")
	if after, err := ownerStore.Show(ctx, "b/x"); err != nil || after.Generation != before.Generation || after.Owner != "" {
		t.Fatalf("a refused acquisition changed b/x: %+v -> %+v (%v)", before, after, err)
	}
	wantDeniedSQL(t, d, "CALL fenced_acquire('o', 1000000, 'b/x')", 50002)

	if err := ownerStore.Grant(ctx, role, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "b/x", time.Minute); err != nil {
		t.Fatalf("after granting every resource: %v", err)
	}
}

// TestGrantRefusesTemporaryTables: an account that may create temporary tables could shadow
// fenced_meta inside the procedures (shown first, on a procedure of the test's own), so Grant
// refuses it.
func TestGrantRefusesTemporaryTables(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	role, roleURL := newUser(t, owner, dbURL)
	var db string
	if err := owner.DB().QueryRowContext(ctx, "SELECT DATABASE()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE DEFINER = CURRENT_USER PROCEDURE probe_epoch() SQL SECURITY DEFINER SELECT epoch FROM fenced_meta WHERE id = 1",
		"GRANT EXECUTE ON PROCEDURE `" + db + "`.probe_epoch TO '" + role + "'@'%'",
		"GRANT CREATE TEMPORARY TABLES ON `" + db + "`.* TO '" + role + "'@'%'",
	} {
		if _, err := owner.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := open(t, roleURL).DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var epoch int64
	if _, err := conn.ExecContext(ctx, "CREATE TEMPORARY TABLE fenced_meta (id INT, epoch BIGINT)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "INSERT INTO fenced_meta VALUES (1, 42)"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(ctx, "CALL probe_epoch()").Scan(&epoch); err != nil || epoch != 42 {
		t.Fatalf("the temporary table did not shadow fenced_meta inside the procedure (%d, %v): the refusal guards nothing", epoch, err)
	}
	err = ownerStore.Grant(ctx, role, nil)
	if err == nil || !strings.Contains(err.Error(), "temporary tables") {
		t.Fatalf("grant to an account that may create temporary tables: %v", err)
	}
	if _, err := owner.DB().ExecContext(ctx, "REVOKE CREATE TEMPORARY TABLES ON `"+db+"`.* FROM '"+role+"'@'%'"); err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.Grant(ctx, role, nil); err != nil {
		t.Fatal(err)
	}
}

// TestForgedSessionTimestampIgnored: SET timestamp moves NOW() and UTC_TIMESTAMP() for the
// session, inside SQL SECURITY DEFINER procedures too (checked first, so the test can tell).
// An admin account that sets it 30 years back or forward still records operations, prunes and
// bumps the epoch on the server's real clock.
func TestForgedSessionTimestampIgnored(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	role, roleURL := newUser(t, owner, dbURL)
	if err := ownerStore.Grant(ctx, role, adminGrant); err != nil {
		t.Fatal(err)
	}
	// One connection, so that the setting holds for every call.
	roleDriver := open(t, roleURL)
	roleDriver.DB().SetMaxOpenConns(1)
	s := newStore(t, roleDriver)
	past := time.Now().AddDate(-30, 0, 0).Unix()
	if _, err := roleDriver.DB().ExecContext(ctx, fmt.Sprintf("SET timestamp = %d", past)); err != nil {
		t.Fatal(err)
	}
	var year int
	if err := roleDriver.DB().QueryRowContext(ctx, "SELECT YEAR(UTC_TIMESTAMP())").Scan(&year); err != nil || year > time.Now().Year()-29 {
		t.Fatalf("SET timestamp did not move UTC_TIMESTAMP() (%d, %v): the test cannot tell", year, err)
	}
	if _, err := s.Resolve(ctx, "forged-past"); err != nil {
		t.Fatal(err)
	}
	r, found, err := ownerStore.LookupOperation(ctx, "forged-past")
	if err != nil || !found || time.Since(r.RecordedAt).Abs() > time.Hour {
		t.Fatalf("recorded at %v with the session's timestamp 30 years back (%v, %v), want now", r.RecordedAt, found, err)
	}
	if n, err := s.PruneOperations(ctx, s.MinPruneAge()); err != nil || n != 0 {
		t.Fatalf("prune with the timestamp 30 years back deleted %d (%v), want 0", n, err)
	}
	future := time.Now().AddDate(30, 0, 0).Unix()
	if _, err := roleDriver.DB().ExecContext(ctx, fmt.Sprintf("SET timestamp = %d", future)); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneOperations(ctx, s.MinPruneAge()); err != nil || n != 0 {
		t.Fatalf("prune with the timestamp 30 years ahead deleted %d (%v), want 0", n, err)
	}
	epoch, err := s.BumpEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if at := time.UnixMicro(epoch); at.After(time.Now().Add(time.Hour)) {
		t.Fatalf("the bumped epoch is the clock at %v, the session's forged time", at)
	}
}

// TestURLTLSAndSecrets: tls=preferred (which may fall back to plain text) is refused; tls=true
// against a server without TLS is an error, not a plain-text connection; a malformed URL's
// error does not repeat its password.
func TestURLTLSAndSecrets(t *testing.T) {
	t.Parallel()
	const secret = "S3cr3t-pw"
	if _, err := mysql.Open("mysql://u:" + secret + "@127.0.0.1:notaport/db"); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("malformed URL: %v", err)
	}
	if _, err := mysql.Open("mysql://u:" + secret + "@127.0.0.1/db?tls=preferred"); err == nil || !strings.Contains(err.Error(), "plain text") {
		t.Errorf("tls=preferred: %v", err)
	}
	dbURL := mysql.CreateTestDatabase(t)
	var haveTLS string
	owner := open(t, dbURL)
	if err := owner.DB().QueryRowContext(testCtx(t), "SELECT @@have_ssl").Scan(&haveTLS); err != nil {
		t.Fatal(err)
	}
	d := open(t, mysql.WithParam(t, dbURL, "tls", "true"))
	err := d.DB().PingContext(testCtx(t))
	if haveTLS != "YES" {
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "tls") {
			t.Fatalf("tls=true against a server without TLS: %v, want a TLS error", err)
		}
		return
	}
	if err == nil { // a server with TLS: its certificate must verify against the system's roots
		t.Log("the server offers TLS and its certificate verified")
	}
}
