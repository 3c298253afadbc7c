package mysql_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"os"
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

// forgedZone is a zone whose offset from UTC was -11:00 in March 2010 and +14:00 in January
// 2020 (daylight saving), and is +13:00 today. It needs the server's time zone tables.
const forgedZone = "Pacific/Apia"

// TestForgedZoneOffsetIgnored: a granted worker that sets a named time zone and a session
// timestamp whose offset differs from the zone's offset now still has its leases judged on the
// server's UTC clock. In forgedZone, NOW() - UTC_TIMESTAMP() under a forged 2010 timestamp is
// -11 h while SYSDATE() is at +13 h, so a clock that subtracted the one from the other ran 24 h
// ahead (a live lease looked expired); under a forged 2020 timestamp it ran 1 h behind (an
// expired lease looked live).
func TestForgedZoneOffsetIgnored(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	var zones int
	if err := owner.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM mysql.time_zone_name WHERE Name = ?`, forgedZone).Scan(&zones); err != nil || zones == 0 {
		msg := fmt.Sprintf("!!! the server has no time zone %s (%v), so a forged zone offset is not tested; load it with: mariadb-tzinfo-to-sql /usr/share/zoneinfo/%s %s | mariadb mysql (.ci/run does)",
			forgedZone, err, forgedZone, forgedZone)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ownerStore := newStore(t, owner)
	for _, r := range []string{"held", "renewed", "published"} {
		if err := ownerStore.Provision(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	role, roleURL := newUser(t, owner, dbURL)
	if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Access: fenced.AccessWorker}); err != nil {
		t.Fatal(err)
	}
	if _, err := ownerStore.Acquire(ctx, "held", time.Hour); err != nil {
		t.Fatal(err)
	}
	// One connection, so that the settings hold for every call.
	worker := open(t, roleURL)
	worker.DB().SetMaxOpenConns(1)
	if err := worker.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var leases []driver.LeaseRef
	for _, r := range []string{"renewed", "published"} {
		g, err := worker.Acquire(ctx, r, "w", time.Hour)
		if err != nil {
			t.Fatalf("acquire %s: %v", r, err)
		}
		leases = append(leases, driver.LeaseRef{Resource: r, Owner: "w", Epoch: g.Epoch, Generation: g.Generation})
		expire(t, owner, r) // expired a second ago
	}
	// forge sets the session's zone and timestamp and returns the session's offset from UTC.
	forge := func(at string) time.Duration {
		t.Helper()
		for _, q := range []string{"SET time_zone = '" + forgedZone + "'", "SET timestamp = UNIX_TIMESTAMP('" + at + "')"} {
			if _, err := worker.DB().ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		var forged int64
		if err := worker.DB().QueryRowContext(ctx, `SELECT TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())`).Scan(&forged); err != nil {
			t.Fatal(err)
		}
		return time.Duration(forged) * time.Minute
	}

	if off := forge("2010-03-01 00:00:00"); off != -11*time.Hour {
		t.Fatalf("offset at the forged 2010 instant is %s, want -11h: the test cannot tell", off)
	}
	var busy *driver.BusyError
	if _, err := worker.Acquire(ctx, "held", "thief", time.Minute); !errors.As(err, &busy) {
		t.Errorf("acquire of a lease held for an hour, with the session's clock forged: %v, want busy", err)
	}

	if off := forge("2020-01-01 00:00:00"); off != 14*time.Hour {
		t.Fatalf("offset at the forged 2020 instant is %s, want 14h: the test cannot tell", off)
	}
	if _, ok, err := worker.Renew(ctx, leases[0], time.Hour); err != nil || ok {
		t.Errorf("renewal of an expired lease, with the session's clock forged: accepted %v (%v), want refused", ok, err)
	}
	ok, err := worker.Publish(ctx, leases[1], driver.Publication{Payload: []byte("late"), OpID: "forged-publish"})
	if err != nil || ok {
		t.Errorf("publication on an expired lease, with the session's clock forged: accepted %v (%v), want refused", ok, err)
	}
	var zone string
	if err := worker.DB().QueryRowContext(ctx, `SELECT @@session.time_zone`).Scan(&zone); err != nil || zone != forgedZone {
		t.Errorf("the session's time zone after the calls is %q (%v), want %s as the session set it", zone, err, forgedZone)
	}
}

// TestMigrateRefreshesGrantedProcedures: a procedure that Grant installed with an older text
// (here: fenced_renew without the line that pins the time zone, as before it had one) is
// re-created by the owner's Migrate, and the role that could call the old one is refused until
// it is granted again.
func TestMigrateRefreshesGrantedProcedures(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	if err := ownerStore.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	role, roleURL := newUser(t, owner, dbURL)
	if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Access: fenced.AccessWorker}); err != nil {
		t.Fatal(err)
	}
	const pin = "SET time_zone = '+00:00';\n"
	var name, mode, create string
	var rest [3]any
	if err := owner.DB().QueryRowContext(ctx, "SHOW CREATE PROCEDURE fenced_renew").Scan(&name, &mode, &create, &rest[0], &rest[1], &rest[2]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(create, pin) {
		t.Fatalf("fenced_renew does not pin the time zone:\n%s", create)
	}
	var db string
	if err := owner.DB().QueryRowContext(ctx, "SELECT DATABASE()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"DROP PROCEDURE fenced_renew",
		strings.Replace(create, pin, "", 1),
		"GRANT EXECUTE ON PROCEDURE `" + db + "`.fenced_renew TO '" + role + "'@'%'",
	} {
		if _, err := owner.DB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := owner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var def string
	if err := owner.DB().QueryRowContext(ctx, `SELECT ROUTINE_DEFINITION FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = 'fenced_renew'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(def, pin) {
		t.Fatalf("Migrate left the older fenced_renew in place:\n%s", def)
	}
	worker := newStore(t, open(t, roleURL))
	l, err := worker.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wantPermission(t, "renew through the re-created procedure", l.Renew(ctx, time.Minute), role, "renew")
	if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Access: fenced.AccessWorker}); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx, time.Minute); err != nil {
		t.Fatalf("renew after granting again: %v", err)
	}
}

// TestProcedureErrorRestoresZone holds utcZone's handler to its comment: a procedure that ends
// in an error (here the prefix check's refusal) puts the caller's time zone back, as one that
// ends normally does. A numeric zone needs no time zone tables.
func TestProcedureErrorRestoresZone(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	if err := ownerStore.Provision(ctx, "b/outside ü"); err != nil {
		t.Fatal(err)
	}
	role, roleURL := newUser(t, owner, dbURL)
	if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Prefixes: []string{"a/"}}); err != nil {
		t.Fatal(err)
	}
	worker := open(t, roleURL)
	worker.DB().SetMaxOpenConns(1) // one session, so that its zone holds across the calls
	if err := worker.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.DB().ExecContext(ctx, `SET time_zone = '+05:30'`); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Acquire(ctx, "b/outside ü", "w", time.Minute); !errors.Is(err, fenced.ErrPermissionDenied) {
		t.Fatalf("acquire outside the prefixes: %v, want permission denied", err)
	}
	var zone string
	if err := worker.DB().QueryRowContext(ctx, `SELECT @@session.time_zone`).Scan(&zone); err != nil || zone != "+05:30" {
		t.Errorf("the session's time zone after a refused call is %q (%v), want +05:30 as the session set it", zone, err)
	}
}
