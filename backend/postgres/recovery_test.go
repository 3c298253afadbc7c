package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/postgres/pgtest"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

var isolationLevels = map[string]map[string]string{
	"read-committed": readCommitted, "repeatable-read": repeatableRead, "serializable": serializable,
}

// TestIncarnationChanged cannot restore or promote a real cluster here, so it changes the
// incarnation recorded in fenced_meta instead: a different system identifier stands for a
// restore from another cluster's copy, a recorded timeline below the server's for a promotion.
// Either way acquisitions and lease-carrying mutations fail with ErrIncarnationChanged (not
// applied) until BumpEpoch records the server's incarnation again. The driver is the schema's
// owner, so it sends the statements (direct mode); TestIncarnationCheckOncePerStatement covers
// a granted role too.
func TestIncarnationChanged(t *testing.T) {
	for name, tamper := range map[string]string{
		"restore":   `UPDATE fenced_meta SET system_identifier = system_identifier + 1`,
		"promotion": `UPDATE fenced_meta SET timeline = timeline - 1`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			d := openDriver(t, testSchema(t, nil))
			s, err := fenced.New(ctx, d, nil)
			if err != nil {
				t.Fatal(err)
			}
			var recorded bool
			if err := d.Pool().QueryRow(ctx, `SELECT system_identifier = `+serverSystemIdentifier+
				` AND timeline = `+serverTimeline+` FROM fenced_meta`).Scan(&recorded); err != nil || !recorded {
				t.Fatalf("migration recorded the server's incarnation: %v, %v", recorded, err)
			}
			if err := s.Provision(ctx, "r", "other"); err != nil {
				t.Fatal(err)
			}
			held, err := s.Acquire(ctx, "r", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.Pool().Exec(ctx, tamper); err != nil {
				t.Fatal(err)
			}

			if _, err := s.Acquire(ctx, "other", time.Minute); !errors.Is(err, fenced.ErrIncarnationChanged) {
				t.Fatalf("acquire after the incarnation changed: %v", err)
			}
			for what, err := range map[string]error{
				"publish": held.Publish(ctx, []byte("x")),
				"renew":   held.Renew(ctx, time.Minute),
				"release": held.Release(ctx),
			} {
				if !errors.Is(err, driver.ErrIncarnationChanged) || !errors.Is(err, driver.ErrNotApplied) || !errors.Is(err, fenced.ErrRefused) {
					t.Errorf("%s after the incarnation changed: %v, want refused, not applied (incarnation changed)", what, err)
				}
			}
			if err := s.Migrate(ctx); err != nil { // Migrate must not accept the new incarnation
				t.Fatal(err)
			}
			if _, err := s.Acquire(ctx, "other", time.Minute); !errors.Is(err, fenced.ErrIncarnationChanged) {
				t.Fatalf("acquire after Migrate: %v", err)
			}

			epoch, err := s.BumpEpoch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l, err := s.Acquire(ctx, "other", time.Minute)
			if err != nil || l.Epoch() != epoch {
				t.Fatalf("acquire after the bump: %v, %v", l, err)
			}
			if err := held.Publish(ctx, []byte("old")); !errors.Is(err, fenced.ErrRefused) {
				t.Fatalf("a lease from before the bump: %v, want refused", err)
			}
			if d.mode.Load() != modeDirect { // the check in the statements, not in the routines
				t.Fatalf("the owner's driver is in mode %d, want direct", d.mode.Load())
			}
		})
	}
}

// TestCheckDurability compares the warnings with the server's SHOW values, then turns
// synchronous_commit off for the driver's own sessions (not for the server) and makes a fenced
// table UNLOGGED in the test's schema.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t, testSchema(t, nil))
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	show := func(name string) string {
		var v string
		if err := d.Pool().QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	var want []string
	if show("fsync") == "off" {
		want = append(want, "fsync")
	}
	if sc := show("synchronous_commit"); sc == "off" || sc == "local" && show("synchronous_standby_names") != "" {
		want = append(want, "synchronous_commit")
	}
	if show("full_page_writes") == "off" {
		want = append(want, "full_page_writes")
	}
	wantWarnings(t, d, want)

	off := openDriver(t, testSchema(t, map[string]string{"synchronous_commit": "off"}))
	if err := off.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wantWarnings(t, off, append(slices.Clone(want), "synchronous_commit is off"))
	if _, err := fenced.New(ctx, off, &fenced.Config{StrictDurability: true}); !errors.Is(err, fenced.ErrNotDurable) {
		t.Fatalf("a strict store with synchronous_commit off: %v", err)
	}

	if _, err := d.Pool().Exec(ctx, `ALTER TABLE fenced_operations SET UNLOGGED`); err != nil {
		t.Fatal(err)
	}
	wantWarnings(t, d, append(want, "fenced_operations are not logged"))
}

func wantWarnings(t *testing.T, d *Driver, want []string) {
	t.Helper()
	got, err := d.CheckDurability(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("warnings %q, want one for each of %q", got, want)
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Fatalf("warning %q does not name %q", got[i], want[i])
		}
	}
}

// TestResolveWaitsForConcurrentPublication: Resolve reaches an operation id while a
// publication that records it is uncommitted. Once the publication commits, Resolve must answer
// accepted: a read in the INSERT's own statement would use the snapshot from before the wait.
func TestResolveWaitsForConcurrentPublication(t *testing.T) {
	for name, params := range isolationLevels {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rawURL := testSchema(t, params)
			d := openDriver(t, rawURL)
			g := migrateAndAcquire(t, d)

			tx := holderTx(t, rawURL)
			tag, err := tx.Exec(ctx, sqlPublish, "r", "a", g.Generation, g.Epoch, []byte("p"), int64(0), "op")
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("publication in the holder's transaction: %v, %v", tag, err)
			}
			resolved, done := make(chan driver.Operation, 1), make(chan error, 1)
			go func() {
				op, err := d.ResolveOperation(ctx, "op")
				resolved <- op
				done <- err
			}()
			waitBlockedBy(t, ctx, tx.Conn().PgConn().PID(), done)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			op := <-resolved
			if err := <-done; err != nil || op.Outcome != driver.OutcomeAccepted || op.Generation != g.Generation || op.Epoch != g.Epoch {
				t.Fatalf("resolve after the publication committed: %+v, %v", op, err)
			}
		})
	}
}

// TestPublishRefusedByConcurrentResolve: a publication reaches its operation id while a Resolve
// that records it as aborted is uncommitted. Once Resolve commits, the publication is refused
// (not an error), and nothing of it remains.
func TestPublishRefusedByConcurrentResolve(t *testing.T) {
	for name, params := range isolationLevels {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rawURL := testSchema(t, params)
			d := openDriver(t, rawURL)
			g := migrateAndAcquire(t, d)

			tx := holderTx(t, rawURL)
			if _, err := tx.Exec(ctx, sqlRecordAborted, "op"); err != nil {
				t.Fatal(err)
			}
			type result struct {
				ok  bool
				err error
			}
			published, done := make(chan result, 1), make(chan error, 1)
			go func() {
				ok, err := d.Publish(ctx, driver.LeaseRef{Resource: "r", Owner: "a", Epoch: g.Epoch, Generation: g.Generation},
					driver.Publication{Payload: []byte("p"), OpID: "op"})
				published <- result{ok, err}
				done <- err
			}()
			waitBlockedBy(t, ctx, tx.Conn().PgConn().PID(), done)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if r := <-published; r.ok || r.err != nil {
				t.Fatalf("publication after Resolve committed: ok=%v err=%v, want refused", r.ok, r.err)
			}
			st, err := d.Read(ctx, "r")
			if err != nil || st.PublishedGeneration != 0 || st.Owner != "a" {
				t.Fatalf("after the refused publication: %+v, %v", st, err)
			}
			if op, err := d.ReadOperation(ctx, "op"); err != nil || op.Outcome != driver.OutcomeAborted {
				t.Fatalf("operation after the refused publication: %+v, %v", op, err)
			}
		})
	}
}

func migrateAndAcquire(t *testing.T, d *Driver) driver.Grant {
	t.Helper()
	ctx := testCtx(t)
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// holderTx opens a transaction on a connection of its own, rolled back at the end of the test.
func holderTx(t *testing.T, rawURL string) pgx.Tx {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// testRole creates a role that can log in, for this test only. Roles belong to the cluster,
// so it gets a random name and is dropped with what was granted to it when the test ends.
func testRole(t *testing.T, admin *Driver) string {
	t.Helper()
	role := "fenced_role_" + strings.ToLower(rand.Text()[:12])
	if _, err := admin.Pool().Exec(testCtx(t), "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := admin.Pool().Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	return role
}

func asRole(t *testing.T, rawURL, role string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// grantedTarget migrates as the schema's owner, grants a new role, and gives the suite drivers
// connected as that role. Expire needs the tables and uses the owner's connection; the lost
// reply goes through the role's connection.
func grantedTarget(params map[string]string) drivertest.NewTarget {
	return func(t *testing.T) drivertest.Target {
		rawURL := testSchema(t, params)
		admin := openDriver(t, rawURL)
		if err := admin.Migrate(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		role := testRole(t, admin)
		if err := admin.Grant(testCtx(t), role, adminSpec); err != nil {
			t.Fatal(err)
		}
		roleURL := asRole(t, rawURL, role)
		return drivertest.Target{
			Open:        func(t *testing.T) driver.Driver { return openDriver(t, roleURL) },
			Expire:      expireWith(admin),
			LostReply:   func(t *testing.T) (driver.Driver, func()) { return lossyDriver(t, roleURL) },
			Unreachable: unreachable,
			// The role cannot create the schema: after the loss the owner migrates and grants
			// again, as an operator would, and the role's store starts from what that created.
			LoseEverything: func(ctx context.Context) error {
				if err := recreateSchema(ctx, rawURL); err != nil {
					return err
				}
				owner := openDriver(t, rawURL)
				if err := owner.Migrate(ctx); err != nil {
					return err
				}
				return owner.Grant(ctx, role, adminSpec)
			},
			SetEpoch:    setEpochWith(admin),
			HoldRowLock: pgtest.HoldRowLock(rawURL),
		}
	}
}

// TestConformanceAsGrantedRole runs the whole suite connected as a role that may only execute
// the routines, at every isolation level.
func TestConformanceAsGrantedRole(t *testing.T) {
	for name, params := range isolationLevels {
		t.Run(name, func(t *testing.T) { drivertest.Run(t, grantedTarget(params)) })
	}
}

// TestGrantedRoleCannotBypass: connected as the granted role, every direct access to the
// tables is denied (42501), and a role that was not granted cannot call the routines.
func TestGrantedRoleCannotBypass(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	admin := openDriver(t, rawURL)
	if err := admin.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Grant(ctx, "fenced_no_such_role", adminSpec); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("grant to a missing role: %v", err)
	}
	role, outsider := testRole(t, admin), testRole(t, admin)
	if err := admin.Grant(ctx, role, adminSpec); err != nil {
		t.Fatal(err)
	}
	if err := admin.Grant(ctx, role, adminSpec); err != nil { // idempotent
		t.Fatal(err)
	}
	granted := openDriver(t, asRole(t, rawURL, role))
	s, err := fenced.New(ctx, granted, nil) // migrates: must only check, as the role may not write
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "r", time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE fenced_resources SET generation = 0`,
		`DELETE FROM fenced_resources`,
		`INSERT INTO fenced_resources (resource) VALUES ('x')`,
		`SELECT payload FROM fenced_resources`,
		`INSERT INTO fenced_operations (op_id, outcome, recorded_at) VALUES ('x', 'accepted', clock_timestamp())`,
		`DELETE FROM fenced_operations`,
		`UPDATE fenced_meta SET epoch = 1`,
		`DELETE FROM fenced_schema_migrations`,
		`TRUNCATE fenced_resources`,
	} {
		wantDenied(t, granted, q)
	}
	// The outsider may see the schema, but was granted no routine: EXECUTE is not PUBLIC's.
	var schema string
	if err := admin.Pool().QueryRow(ctx, sqlCurrentSchema).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Pool().Exec(ctx, "GRANT USAGE ON SCHEMA "+pgx.Identifier{schema}.Sanitize()+" TO "+outsider); err != nil {
		t.Fatal(err)
	}
	other := openDriver(t, asRole(t, rawURL, outsider))
	wantDenied(t, other, rtAcquire.call(), "r", "o", int64(1000))
	wantDenied(t, other, `UPDATE fenced_resources SET generation = 0`)
}

func wantDenied(t *testing.T, d *Driver, q string, args ...any) {
	t.Helper()
	_, err := d.Pool().Exec(testCtx(t), q, args...)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s: %v, want insufficient_privilege (42501)", q, err)
	}
}
