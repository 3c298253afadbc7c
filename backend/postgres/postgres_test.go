package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/postgres/pgtest"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const defaultTestURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func ping(rawURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// isolation levels set as default_transaction_isolation on every connection of a target.
var (
	readCommitted  = map[string]string{"default_transaction_isolation": "read committed"}
	repeatableRead = map[string]string{"default_transaction_isolation": "repeatable read"}
	serializable   = map[string]string{"default_transaction_isolation": "serializable"}
)

// testSchema creates a schema with a random name, drops it when the test ends, and returns a URL
// whose connections have it as their search_path, plus params (runtime parameters, or pgxpool's
// pool_* settings).
func testSchema(t testing.TB, params map[string]string) string {
	t.Helper()
	base := drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", defaultTestURL, ping)
	schema := "fenced_test_" + strings.ToLower(rand.Text()[:16])
	admin, err := pgx.Connect(testCtx(t), base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(testCtx(t), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		_ = admin.Close(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		_ = admin.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx does not read + as a space
	return u.String()
}

func openDriver(t testing.TB, rawURL string) *Driver {
	t.Helper()
	d, err := Open(testCtx(t), rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

const sqlExpire = `UPDATE fenced_resources SET lease_until = clock_timestamp() - interval '1 second'
WHERE resource = $1 AND lease_until IS NOT NULL`

func newTarget(params map[string]string) drivertest.NewTarget {
	return func(t *testing.T) drivertest.Target {
		rawURL := testSchema(t, params)
		admin := openDriver(t, rawURL)
		return drivertest.Target{
			Open:           func(t *testing.T) driver.Driver { return openDriver(t, rawURL) },
			Expire:         expireWith(admin),
			LostReply:      func(t *testing.T) (driver.Driver, func()) { return lossyDriver(t, rawURL) },
			Unreachable:    unreachable,
			LoseEverything: func(ctx context.Context) error { return recreateSchema(ctx, rawURL) },
			SetEpoch:       setEpochWith(admin),
			HoldRowLock:    pgtest.HoldRowLock(rawURL),
		}
	}
}

// recreateSchema drops the schema that rawURL's search_path names, with everything in it, and
// creates it empty: a total loss of the store, as a re-initialised cluster would be.
func recreateSchema(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	schema := pgx.Identifier{u.Query().Get("search_path")}.Sanitize()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE; CREATE SCHEMA "+schema)
	return err
}

// setEpochWith overwrites the store's epoch, as a store created before epochs came from the
// clock holds a small one.
func setEpochWith(admin *Driver) func(ctx context.Context, epoch int64) error {
	return func(ctx context.Context, epoch int64) error {
		_, err := admin.Pool().Exec(ctx, "UPDATE fenced_meta SET epoch = $1", epoch)
		return err
	}
}

// expireWith runs at read committed whatever the target's default isolation: a test may expire a
// lease while its holder renews it, and a serializable UPDATE would then fail with 40001 where
// the test means the expiry to win after the renewal's commit.
func expireWith(admin *Driver) func(ctx context.Context, resource string) error {
	return func(ctx context.Context, resource string) error {
		return pgx.BeginTxFunc(ctx, admin.Pool(), pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sqlExpire, resource)
			return err
		})
	}
}

// lossyDriver connects through a proxy whose reply to the next execution can be lost after
// the server has executed the call. pgxpool's ping of a connection idle for more than a second is turned
// off: it would otherwise be the exchange whose reply is lost.
func lossyDriver(t *testing.T, rawURL string) (driver.Driver, func()) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := drivertest.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The reply lost is the execution's: pgx sends a cached statement's execution as
	// Bind/Execute/Sync, and its first preparation (Parse/Describe/Sync) changes nothing.
	execution := func(request []byte) bool { return len(request) > 0 && request[0] == 'B' }
	return New(pool), func() { proxy.LoseReplyToRequest(execution) }
}

func unreachable(t *testing.T) driver.Driver {
	return openDriver(t, "postgres://postgres@"+drivertest.ClosedAddr(t)+"/postgres?sslmode=disable&connect_timeout=5")
}

// wantIsolation checks that the runtime parameter reached the server, so that a suite run under
// an isolation level really ran under it.
func wantIsolation(t *testing.T, params map[string]string) {
	t.Helper()
	d := openDriver(t, testSchema(t, params))
	var level string
	if err := d.Pool().QueryRow(testCtx(t), "SHOW default_transaction_isolation").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if want := params["default_transaction_isolation"]; level != want {
		t.Fatalf("default_transaction_isolation = %q, want %q", level, want)
	}
}

func TestConformance(t *testing.T) { drivertest.Run(t, newTarget(nil)) }

// Under REPEATABLE READ and SERIALIZABLE an UPDATE that meets a concurrent update fails with a
// serialization failure instead of re-checking; the driver must still give losers "busy".
func TestConformanceRepeatableRead(t *testing.T) {
	wantIsolation(t, repeatableRead)
	drivertest.Run(t, newTarget(repeatableRead))
}

func TestConformanceSerializable(t *testing.T) {
	wantIsolation(t, serializable)
	drivertest.Run(t, newTarget(serializable))
}

// TestPublishWaitsOnRowLockWhileLeaseExpires: A's publication reaches the row while another
// transaction holds it locked; that transaction ends the lease and commits while A's statement
// waits. The statement must judge expiry after the wait, so A is refused as expired. The
// holder sets lease_until to its clock_timestamp(), a moment after A's statement began: a
// statement that compared with now() (its start) would still see the lease as live.
func TestPublishWaitsOnRowLockWhileLeaseExpires(t *testing.T) {
	for name, params := range map[string]map[string]string{
		"read-committed": readCommitted, "repeatable-read": repeatableRead, "serializable": serializable,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rawURL := testSchema(t, params)
			store, err := fenced.New(ctx, openDriver(t, rawURL), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Provision(ctx, "r"); err != nil {
				t.Fatal(err)
			}
			lease, err := store.Acquire(ctx, "r", time.Minute)
			if err != nil {
				t.Fatal(err)
			}

			holder, err := pgx.Connect(ctx, rawURL)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close(context.Background())
			tx, err := holder.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := tx.Exec(ctx, `SELECT FROM fenced_resources WHERE resource = 'r' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}

			published := make(chan error, 1)
			go func() { published <- lease.Publish(ctx, []byte("late")) }()
			waitBlockedBy(t, ctx, holder.PgConn().PID(), published)

			if _, err := tx.Exec(ctx, `UPDATE fenced_resources SET lease_until = clock_timestamp() WHERE resource = 'r'`); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			err = <-published
			var re *fenced.RefusedError
			if !errors.As(err, &re) || re.Cause != fenced.CauseExpired {
				t.Fatalf("publish after waiting on the lock: %v, want a refusal (expired)", err)
			}
			if st, err := store.Show(ctx, "r"); err != nil || st.PublishedGeneration != 0 {
				t.Fatalf("after the refused publication: %+v, %v", st, err)
			}
		})
	}
}

// waitBlockedBy polls the server until some backend waits for a lock held by backend pid. It
// fails if the operation under test finished instead of blocking.
func waitBlockedBy(t *testing.T, ctx context.Context, pid uint32, done <-chan error) {
	t.Helper()
	conn, err := pgx.Connect(ctx, drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", defaultTestURL, ping))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1::int = ANY(pg_blocking_pids(pid))`, int32(pid)).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the operation finished without waiting on the row lock: %v", err)
		case <-ctx.Done():
			t.Fatal("no backend waited on the row lock")
		case <-tick.C:
		}
	}
}

// TestStatementsUseStatementClock runs the driver's statements inside a transaction that began
// before the lease ran out. now() in that transaction is still before the expiry, so a
// statement that used it would renew, publish, or refuse the acquisition; with
// clock_timestamp() each sees the lease expired. The test first shows that now() would indeed
// have judged the lease live.
func TestStatementsUseStatementClock(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	d := openDriver(t, rawURL)
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	grant, err := d.Acquire(ctx, "r", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var txStart time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&txStart); err != nil {
		t.Fatal(err)
	}

	// The lease ends now, on another connection, after the transaction began.
	var until time.Time
	if err := d.Pool().QueryRow(ctx, `UPDATE fenced_resources SET lease_until = clock_timestamp()
		WHERE resource = 'r' RETURNING lease_until`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if !until.After(txStart) {
		t.Fatalf("expiry %s is not after the transaction's start %s", until, txStart)
	}
	var liveByNow bool
	if err := tx.QueryRow(ctx, `SELECT lease_until > now() FROM fenced_resources WHERE resource = 'r'`).Scan(&liveByNow); err != nil || !liveByNow {
		t.Fatalf("now() in the old transaction should still see the lease live: %v, %v", liveByNow, err)
	}

	ttl := time.Minute.Microseconds()
	rows, err := tx.Query(ctx, sqlRenew, "r", "a", grant.Generation, grant.Epoch, ttl)
	if err != nil {
		t.Fatal(err)
	}
	renewed := 0
	for rows.Next() {
		renewed++
	}
	if rows.Close(); rows.Err() != nil || renewed != 0 {
		t.Fatalf("renewal of an expired lease matched %d rows (%v)", renewed, rows.Err())
	}
	for _, q := range []string{sqlPublish, sqlPublishAndRelease} {
		tag, err := tx.Exec(ctx, q, "r", "a", grant.Generation, grant.Epoch, []byte("late"), int64(0), "op-late")
		if err != nil || tag.RowsAffected() != 0 {
			t.Fatalf("publication on an expired lease changed %d rows (%v):\n%s", tag.RowsAffected(), err, q)
		}
	}
	var acquired, seenFree bool
	var epoch, gen int64
	var leaseUntil *time.Time
	if err := tx.QueryRow(ctx, sqlAcquire, "r", "b", ttl).Scan(&acquired, &epoch, &gen, &leaseUntil, &seenFree); err != nil {
		t.Fatal(err)
	}
	if !acquired || gen != grant.Generation+1 {
		t.Fatalf("acquisition of an expired lease: acquired=%v generation=%d", acquired, gen)
	}
}

// TestNoTransactionClock is the cheap guard beside the test above: no statement names a clock
// that is frozen at transaction start.
func TestNoTransactionClock(t *testing.T) {
	qs := []string{sqlMigrationsRecord, sqlRecordIncarnation}
	for _, r := range routines {
		qs = append(qs, r.create("s"))
	}
	for _, q := range qs {
		l := strings.ToLower(q)
		for _, frozen := range []string{"now()", "current_timestamp", "transaction_timestamp", "statement_timestamp", "localtimestamp"} {
			if strings.Contains(l, frozen) {
				t.Errorf("statement uses %s:\n%s", frozen, q)
			}
		}
	}
}

// TestMigrationLeavesLoggedTables: an UNLOGGED table is emptied by crash recovery, which would
// reset generations.
func TestMigrationLeavesLoggedTables(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t, testSchema(t, nil))
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, table := range fencedTables {
		var persistence string
		if err := d.Pool().QueryRow(ctx, `SELECT relpersistence::text FROM pg_class WHERE oid = $1::regclass`, table).Scan(&persistence); err != nil {
			t.Fatal(err)
		}
		if persistence != "p" {
			t.Fatalf("%s has relpersistence %q, want p (permanent, logged)", table, persistence)
		}
	}
}

// TestConcurrentMigrate: migrations started together on a fresh schema all succeed and apply
// each version once, also when the server's default isolation is SERIALIZABLE.
func TestConcurrentMigrate(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, serializable)
	const n = 4
	drivers := make([]*Driver, n)
	for i := range drivers {
		drivers[i] = openDriver(t, rawURL)
		if err := drivers[i].Pool().Ping(ctx); err != nil { // connect before the barrier
			t.Fatal(err)
		}
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, d := range drivers {
		wg.Go(func() {
			<-start
			errs[i] = d.Migrate(ctx)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrate %d: %v", i, err)
		}
	}
	var count, version int
	if err := drivers[0].Pool().QueryRow(ctx, `SELECT count(*), max(version) FROM fenced_schema_migrations`).Scan(&count, &version); err != nil {
		t.Fatal(err)
	}
	latest, _, err := latestVersion()
	if err != nil {
		t.Fatal(err)
	}
	if count != latest || version != latest {
		t.Fatalf("migrations recorded: %d, latest %d; want %d and %d", count, version, latest, latest)
	}
	if err := drivers[0].Migrate(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
}

func TestOpenAndNew(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	if _, err := Open(ctx, "mysql://root@127.0.0.1/x"); err == nil {
		t.Fatal("Open accepted a mysql:// URL")
	}
	rawURL := testSchema(t, nil)
	alt := "postgresql://" + strings.TrimPrefix(rawURL, "postgres://")
	d := openDriver(t, alt)
	if err := d.Migrate(ctx); err != nil {
		t.Fatalf("migrate through a postgresql:// URL: %v", err)
	}

	// New leaves the caller's pool open.
	borrowed := New(d.Pool())
	if err := borrowed.Close(); err != nil {
		t.Fatal(err)
	}
	if err := borrowed.Provision(ctx, "r"); err != nil {
		t.Fatalf("provision after closing a driver over a borrowed pool: %v", err)
	}
	if _, err := borrowed.Acquire(ctx, "missing", "o", time.Minute); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("acquire unprovisioned: %v", err)
	}
}

// TestAcquireLosingAfterLockWaitNamesWinner: an acquisition that waits on a row lock held by a
// concurrent acquisition, and loses once that commits, reports the winner's generation and
// expiry, not the free lease its statement's snapshot still shows.
func TestAcquireLosingAfterLockWaitNamesWinner(t *testing.T) {
	for name, params := range map[string]map[string]string{
		"read-committed": readCommitted, "repeatable-read": repeatableRead, "serializable": serializable,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rawURL := testSchema(t, params)
			d := openDriver(t, rawURL)
			if err := d.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if err := d.Provision(ctx, "r"); err != nil {
				t.Fatal(err)
			}

			winner, tx, gen, until := acquireUncommitted(t, ctx, rawURL, "r")

			type result struct {
				g   driver.Grant
				err error
			}
			lost, done := make(chan result, 1), make(chan error, 1)
			go func() {
				g, err := d.Acquire(ctx, "r", "loser", time.Minute)
				lost <- result{g, err}
				done <- err
			}()
			waitBlockedBy(t, ctx, winner.PgConn().PID(), done)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-lost
			var be *driver.BusyError
			if !errors.As(r.err, &be) {
				t.Fatalf("losing acquisition: %+v, %v; want busy", r.g, r.err)
			}
			if be.Generation != gen || !be.LeaseUntil.Equal(until.Time) {
				t.Fatalf("busy names generation %d until %s, want the winner's %d until %s",
					be.Generation, be.LeaseUntil, gen, until.Time)
			}
		})
	}
}

// acquireUncommitted acquires resource as "winner" in a transaction of its own connection and
// leaves it open, so that another acquisition waits on the row lock until tx commits. It
// returns the connection, the transaction and the winner's generation and expiry; both are
// closed in Cleanup.
func acquireUncommitted(t *testing.T, ctx context.Context, rawURL, resource string) (*pgx.Conn, pgx.Tx, int64, pgtype.Timestamptz) {
	t.Helper()
	winner, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = winner.Close(context.Background()) })
	tx, err := winner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var (
		dummy      bool
		epoch, gen int64
		until      pgtype.Timestamptz
	)
	if err := tx.QueryRow(ctx, sqlAcquire, resource, "winner", time.Minute.Microseconds()).Scan(&dummy, &epoch, &gen, &until, &dummy); err != nil {
		t.Fatal(err)
	}
	return winner, tx, gen, until
}

// TestAcquireLosingThenReadFails: the loser's statement is refused after the lock wait and the
// reply to the read that would name the winner is lost. The refusal is certain, so the error
// must be not applied, never an unknown outcome (which a caller would have to resolve).
func TestAcquireLosingThenReadFails(t *testing.T) {
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	admin := openDriver(t, rawURL)
	if err := admin.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.Provision(ctx, "r é"); err != nil {
		t.Fatal(err)
	}
	drv, arm := lossyDriver(t, rawURL)
	d := drv.(*Driver)
	if _, err := d.Read(ctx, "r é"); err != nil { // prepares the read, so that arm loses its execution
		t.Fatal(err)
	}
	winner, tx, _, _ := acquireUncommitted(t, ctx, rawURL, "r é")
	d.beforeLostRaceRead = arm // the reply to the read after the refusal is lost
	done := make(chan error, 1)
	go func() {
		_, err := d.Acquire(ctx, "r é", "loser", time.Minute)
		done <- err
	}()
	waitBlockedBy(t, ctx, winner.PgConn().PID(), done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("losing acquisition whose read failed: %v; want not applied", err)
	}
}
