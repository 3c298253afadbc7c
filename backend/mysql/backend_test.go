package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/driver"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newStore(t *testing.T, d driver.Driver) *fenced.Store {
	t.Helper()
	s, err := fenced.New(testCtx(t), d, nil)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return s
}

func expire(t *testing.T, d *mysql.Driver, resource string) {
	t.Helper()
	if _, err := d.DB().ExecContext(testCtx(t), expireSQL, resource); err != nil {
		t.Fatalf("expire: %v", err)
	}
}

// TestTimeZonesAgreeOnExpiry runs two workers whose sessions are nine hours ahead of and seven
// hours behind UTC. Had an expiry been written or judged in session time, the worker behind UTC
// would write expiries that the other already sees as past (and could take over at once), and
// each would see a different distance between now and the expiry.
func TestTimeZonesAgreeOnExpiry(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	east := open(t, mysql.WithParam(t, dbURL, "time_zone", "'+09:00'"))
	west := open(t, mysql.WithParam(t, dbURL, "time_zone", "'-07:00'"))
	for d, want := range map[*mysql.Driver]string{east: "+09:00", west: "-07:00"} {
		var tz string
		var skew int64
		err := d.DB().QueryRowContext(testCtx(t),
			`SELECT @@session.time_zone, TIMESTAMPDIFF(HOUR, UTC_TIMESTAMP(), NOW())`).Scan(&tz, &skew)
		if err != nil {
			t.Fatal(err)
		}
		if tz != want || skew == 0 {
			t.Fatalf("session time zone %q (NOW() is %d h from UTC), want %q", tz, skew, want)
		}
	}
	a, b := newStore(t, west), newStore(t, east)
	if err := a.Provision(testCtx(t), "report"); err != nil {
		t.Fatal(err)
	}

	const ttl = time.Minute
	leaseA, err := a.Acquire(testCtx(t), "report", ttl)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(testCtx(t), "report", ttl)
	var busy *fenced.BusyError
	if !errors.As(err, &busy) {
		t.Fatalf("acquire from +09:00 while -07:00 holds: %v, want busy", err)
	}
	if !busy.LeaseUntil.Equal(leaseA.LeaseUntil()) || busy.Generation != leaseA.Generation() {
		t.Fatalf("the sessions disagree: holder says %s (gen %d), busy error says %s (gen %d)",
			leaseA.LeaseUntil(), leaseA.Generation(), busy.LeaseUntil, busy.Generation)
	}
	for name, s := range map[string]*fenced.Store{"-07:00": a, "+09:00": b} {
		st, err := s.Show(testCtx(t), "report")
		if err != nil {
			t.Fatal(err)
		}
		if left := st.LeaseUntil.Sub(st.Now); !st.LeaseUntil.Equal(leaseA.LeaseUntil()) || left <= 0 || left > ttl {
			t.Fatalf("%s sees expiry %s at %s (%s left), holder says %s", name, st.LeaseUntil, st.Now, left, leaseA.LeaseUntil())
		}
	}

	// The handover: A (behind UTC) is superseded by B (ahead of UTC) once the lease expires.
	expire(t, east, "report")
	leaseB, err := b.Acquire(testCtx(t), "report", ttl)
	if err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	var refused *fenced.RefusedError
	if err := leaseA.Publish(testCtx(t), []byte("A")); !errors.As(err, &refused) || refused.Cause != fenced.CauseSuperseded {
		t.Fatalf("A's publication after B acquired: %v, want superseded", err)
	}
	if err := leaseB.Renew(testCtx(t), ttl); err != nil {
		t.Fatalf("B renew: %v", err)
	}
	st, err := a.Show(testCtx(t), "report")
	if err != nil {
		t.Fatal(err)
	}
	if !st.LeaseUntil.Equal(leaseB.LeaseUntil()) {
		t.Fatalf("renewal from +09:00 reported %s, -07:00 reads %s", leaseB.LeaseUntil(), st.LeaseUntil)
	}
	if err := leaseB.PublishAndRelease(testCtx(t), []byte("B")); err != nil {
		t.Fatalf("B publish: %v", err)
	}
}

// TestMatchedRowsCount checks that the driver counts matched rows: an UPDATE that writes the
// value already stored reports one row, so a renewal that lands on the stored expiry is not
// mistaken for a refusal. A handle that counts changed rows is turned away by Migrate.
func TestMatchedRowsCount(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	d := open(t, dbURL)
	s := newStore(t, d)
	if err := s.Provision(testCtx(t), "r"); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(testCtx(t), "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.DB().ExecContext(testCtx(t), `UPDATE fenced_resources SET lease_until = lease_until WHERE resource = ?`, "r")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("an UPDATE writing the same value reported %d rows (%v), want 1", n, err)
	}
	for range 2 {
		if err := l.Renew(testCtx(t), time.Minute); err != nil {
			t.Fatalf("renew: %v", err)
		}
	}

	dsn, err := mysql.DSN(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = false
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := mysql.New(db).Migrate(testCtx(t)); err == nil || !strings.Contains(err.Error(), "clientFoundRows") {
		t.Fatalf("migrate on a handle without clientFoundRows: %v, want an error naming it", err)
	}

	// The caller's own handle, opened with DSN, works and is left open by Close.
	db2, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	own := mysql.New(db2)
	if err := own.Migrate(testCtx(t)); err != nil {
		t.Fatalf("migrate on a DSN handle: %v", err)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db2.PingContext(testCtx(t)); err != nil {
		t.Fatalf("Close closed the caller's handle: %v", err)
	}
}

// TestHandoverOnSeparateConnections runs the handover with each worker pinned to one server
// session of its own, checked by connection id.
func TestHandoverOnSeparateConnections(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	da, db, admin := open(t, dbURL), open(t, dbURL), open(t, dbURL)
	ids := map[int64]bool{}
	for _, d := range []*mysql.Driver{da, db, admin} {
		d.DB().SetMaxOpenConns(1)
		var id int64
		if err := d.DB().QueryRowContext(testCtx(t), `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	if len(ids) != 3 {
		t.Fatalf("workers share a server session: %v", ids)
	}
	a, b := newStore(t, da), newStore(t, db)
	if err := a.Provision(testCtx(t), "report"); err != nil {
		t.Fatal(err)
	}
	leaseA, err := a.Acquire(testCtx(t), "report", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	atPublish, goPublish := make(chan struct{}), make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		close(atPublish)
		<-goPublish
		errA <- leaseA.Publish(context.Background(), []byte("from A"))
	}()
	<-atPublish
	expire(t, admin, "report")
	leaseB, err := b.Acquire(testCtx(t), "report", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	close(goPublish)
	var refused *fenced.RefusedError
	if err := <-errA; !errors.As(err, &refused) || refused.Cause != fenced.CauseSuperseded {
		t.Fatalf("A's publication: %v, want superseded", err)
	}
	if err := leaseB.Publish(testCtx(t), []byte("from B")); err != nil {
		t.Fatal(err)
	}
	got, gen, err := b.Get(testCtx(t), "report")
	if err != nil || string(got) != "from B" || gen != leaseA.Generation()+1 {
		t.Fatalf("published %q at %d (%v)", got, gen, err)
	}
}

// TestPublishWaitsOnRowLockWhileLeaseExpires: A's publication blocks on a row lock held by an
// open transaction that expires A's lease. When that commits, A's statement re-reads the
// committed row under its lock and is refused; the clock it froze at its start does not help it.
func TestPublishWaitsOnRowLockWhileLeaseExpires(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	da, admin := open(t, dbURL), open(t, dbURL)
	da.DB().SetMaxOpenConns(1)
	a := newStore(t, da)
	if err := a.Provision(testCtx(t), "r"); err != nil {
		t.Fatal(err)
	}
	leaseA, err := a.Acquire(testCtx(t), "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var idA int64
	if err := da.DB().QueryRowContext(testCtx(t), `SELECT CONNECTION_ID()`).Scan(&idA); err != nil {
		t.Fatal(err)
	}

	tx, err := admin.DB().BeginTx(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(testCtx(t), expireSQL, "r"); err != nil {
		t.Fatal(err)
	}
	errA := make(chan error, 1)
	go func() { errA <- leaseA.Publish(context.Background(), []byte("late")) }()

	// The server, not a sleep, says when A's statement is waiting on the lock. MariaDB refreshes
	// its INNODB_TRX cache only when it was not read for 100 ms, so poll more slowly than that.
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for waiting := false; !waiting; {
		select {
		case err := <-errA:
			t.Fatalf("A's publication finished while the row was locked: %v", err)
		case <-tick.C:
		}
		err := mysql.QueryInnoDBTrx(testCtx(t), admin.DB(), `SELECT COUNT(*) > 0 FROM information_schema.INNODB_TRX
WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'`, []any{idA}, &waiting)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var refused *fenced.RefusedError
	if err := <-errA; !errors.As(err, &refused) || refused.Cause != fenced.CauseExpired {
		t.Fatalf("publication that waited out the expiry: %v, want refused as expired", err)
	}
	if st, err := a.Show(testCtx(t), "r"); err != nil || st.PublishedGeneration != 0 {
		t.Fatalf("after the refused publication: %+v, %v", st, err)
	}
}

// TestAcquireReportsServerExpiry: the expiry in a grant is the one the server stored.
func TestAcquireReportsServerExpiry(t *testing.T) {
	t.Parallel()
	d := open(t, mysql.CreateTestDatabase(t))
	if err := d.Migrate(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(testCtx(t), "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(testCtx(t), "r", "owner-1", 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Read(testCtx(t), "r")
	if err != nil {
		t.Fatal(err)
	}
	if g.Generation != 1 || !g.LeaseUntil.Equal(st.LeaseUntil) || st.LeaseUntil.Sub(st.Now) > 90*time.Second {
		t.Fatalf("grant %+v, row %+v", g, st)
	}
	if g.LeaseUntil.Nanosecond()%1000 != 0 || g.LeaseUntil.Location() != time.UTC {
		t.Fatalf("expiry %s is not a UTC microsecond", g.LeaseUntil)
	}
	_, err = d.Acquire(testCtx(t), "r", "owner-2", time.Minute)
	var busy *driver.BusyError
	if !errors.As(err, &busy) || busy.Generation != 1 || !busy.LeaseUntil.Equal(g.LeaseUntil) {
		t.Fatalf("second acquire: %v (%+v), want busy at generation 1 until %s", err, busy, g.LeaseUntil)
	}
	if _, err := d.Acquire(testCtx(t), "missing", "owner-3", time.Minute); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("acquire missing: %v", err)
	}
}

// TestResourceNamesAreExact: names differing only in case or trailing spaces are different
// resources, as in every other backend.
func TestResourceNamesAreExact(t *testing.T) {
	t.Parallel()
	d := open(t, mysql.CreateTestDatabase(t))
	s := newStore(t, d)
	names := []string{"r", "R", "r ", "é", "e\u0301"}
	if err := s.Provision(testCtx(t), names...); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := s.Acquire(testCtx(t), n, time.Minute); err != nil {
			t.Fatalf("acquire %q: %v (names collided)", n, err)
		}
	}
}

// TestConcurrentMigrate: migrations started at once from separate pools all succeed, once.
func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	const n = 4
	drivers := make([]*mysql.Driver, n)
	for i := range drivers {
		drivers[i] = open(t, dbURL)
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, d := range drivers {
		wg.Go(func() {
			<-start
			errs[i] = d.Migrate(testCtx(t))
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrate %d: %v", i, err)
		}
	}
	var versions int
	if err := drivers[0].DB().QueryRowContext(testCtx(t), `SELECT COUNT(*) FROM fenced_schema_migrations`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if versions != 2 {
		t.Fatalf("%d version rows, want one per migration (2)", versions)
	}
}

func TestDSN(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"mysql://root@127.0.0.1:3306/test", "root@tcp(127.0.0.1:3306)/test?clientFoundRows=true&interpolateParams=true"},
		{"mariadb://u:p%40ss%3Aw@db.example/fenced", "u:p@ss:w@tcp(db.example:3306)/fenced?clientFoundRows=true&interpolateParams=true"},
		{"mysql://u@[::1]:3307/x?time_zone=%27%2B09%3A00%27", "u@tcp([::1]:3307)/x?clientFoundRows=true&interpolateParams=true&time_zone=%27%2B09%3A00%27"},
		{"mysql://u@h/x?readTimeout=5s&clientFoundRows=true&interpolateParams=false", "u@tcp(h:3306)/x?clientFoundRows=true&readTimeout=5s"},
	} {
		got, err := mysql.DSN(c.url)
		if err != nil || got != c.want {
			t.Errorf("DSN(%q) = %q, %v; want %q", c.url, got, err, c.want)
		}
	}
	for _, bad := range []string{
		"postgres://u@h/x", "mysql://u@h/", "mysql://u@h/x?clientFoundRows=false", "mysql://u@h/x?readTimeout=soon",
	} {
		if got, err := mysql.DSN(bad); err == nil {
			t.Errorf("DSN(%q) = %q, want an error", bad, got)
		}
	}
}
