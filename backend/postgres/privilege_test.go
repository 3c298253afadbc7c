package postgres

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// cachingIncarnationBody is the check as an earlier version wrote it: the server's incarnation
// kept in a session setting that the caller can set. The test installs it to show that the
// forged setting is what it catches.
const cachingIncarnationBody = `DECLARE
    server   text := current_setting('fenced.server_incarnation', true);
    recorded text;
BEGIN
    IF server IS NULL OR server = '' THEN
        server := ` + serverSystemIdentifier + ` || '/' || ` + serverTimeline + `;
        PERFORM set_config('fenced.server_incarnation', server, false);
    END IF;
    SELECT system_identifier || '/' || timeline INTO recorded FROM fenced_meta WHERE id = 1;
    IF recorded IS DISTINCT FROM server THEN
        RAISE EXCEPTION 'incarnation differs' USING ERRCODE = '` + sqlstateIncarnation + `';
    END IF;
    RETURN true;
END`

// TestForgedIncarnationSettingIgnored is the reproduction: with the recorded
// incarnation made to differ from the server's (as after a promotion), a granted role sets
// fenced.server_incarnation to the recorded value and calls fenced_acquire on the same
// connection. The call must still be refused by the incarnation check, and nothing change.
// Run against the old, caching body, the same session acquires (the test can fail).
func TestForgedIncarnationSettingIgnored(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"current", "caching"} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rawURL := testSchema(t, nil)
			owner := openDriver(t, rawURL)
			if err := owner.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := owner.BumpEpoch(ctx); err != nil { // so that epoch != generation
				t.Fatal(err)
			}
			const resource = "café reports/ü x"
			if err := owner.Provision(ctx, resource); err != nil {
				t.Fatal(err)
			}
			role := testRole(t, owner)
			if err := owner.Grant(ctx, role, adminSpec); err != nil {
				t.Fatal(err)
			}
			if body == "caching" { // after Grant, which would put the current body back
				if _, err := owner.Pool().Exec(ctx, "CREATE OR REPLACE FUNCTION fenced_incarnation_ok() RETURNS boolean "+
					"LANGUAGE plpgsql VOLATILE AS $fenced$"+cachingIncarnationBody+"$fenced$"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := owner.Pool().Exec(ctx, `UPDATE fenced_meta SET timeline = timeline - 1`); err != nil {
				t.Fatal(err)
			}
			var recorded string
			if err := owner.Pool().QueryRow(ctx, `SELECT system_identifier || '/' || timeline FROM fenced_meta`).Scan(&recorded); err != nil {
				t.Fatal(err)
			}

			conn, err := pgx.Connect(ctx, asRole(t, rawURL, role))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "SELECT set_config('fenced.server_incarnation', $1, false)", recorded); err != nil {
				t.Fatal(err)
			}
			_, err = conn.Exec(ctx, `SELECT * FROM fenced_acquire($1, 'ownerA', 10000000)`, resource)
			var pgErr *pgconn.PgError
			refused := errors.As(err, &pgErr) && pgErr.Code == sqlstateIncarnation
			var generation int64
			if err := owner.Pool().QueryRow(ctx, `SELECT generation FROM fenced_resources WHERE resource = $1`, resource).Scan(&generation); err != nil {
				t.Fatal(err)
			}
			switch body {
			case "current":
				if !refused || generation != 0 {
					t.Fatalf("acquire with a forged fenced.server_incarnation: %v, generation %d; want refused (%s), nothing changed",
						err, generation, sqlstateIncarnation)
				}
				if !strings.Contains(pgErr.Message, recorded) {
					t.Errorf("message %q does not name the recorded incarnation %s", pgErr.Message, recorded)
				}
			case "caching":
				if refused || generation != 1 {
					t.Fatalf("the caching check was not fooled (%v, generation %d): the test cannot tell the bug", err, generation)
				}
			}
		})
	}
}

// adminSpec grants every operation, as the conformance suite needs (it provisions and bumps).
var adminSpec = driver.GrantSpec{Access: driver.AccessAdmin}

// roleDriver opens a driver connected as role and a store on it (whose Migrate only checks).
func roleStore(t *testing.T, rawURL, role string) (*Driver, *fenced.Store) {
	t.Helper()
	d := openDriver(t, asRole(t, rawURL, role))
	s, err := fenced.New(testCtx(t), d, nil)
	if err != nil {
		t.Fatalf("open a store as %s: %v", role, err)
	}
	return d, s
}

// wantPermission checks that err is the database's refusal for lack of rights, naming the
// role and the operation.
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

// wantDeniedSQL: the database itself refuses the call to role (42501), not the driver.
func wantDeniedSQL(t *testing.T, d *Driver, q string, args ...any) {
	t.Helper()
	_, err := d.Pool().Exec(testCtx(t), q, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s as %s: %v, want insufficient_privilege (42501)", q, d.Pool().Config().ConnConfig.User, err)
	}
}

// TestGrantLevels: a reader, a worker and an admin role on one store, after an epoch bump.
// Each may do what its level includes; everything else is refused by the database, through
// the store (one sentence naming the role and the operation, nothing changed) and as direct
// SQL. Granting again with another level revokes what the new level does not include.
func TestGrantLevels(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	owner := openDriver(t, rawURL)
	ownerStore, err := fenced.New(ctx, owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ownerStore.BumpEpoch(ctx); err != nil { // epoch != generation from here on
		t.Fatal(err)
	}
	const resource = "team a/ü build"
	if err := ownerStore.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	reader, worker, admin := testRole(t, owner), testRole(t, owner), testRole(t, owner)
	for role, a := range map[string]driver.Access{reader: driver.AccessReader, worker: driver.AccessWorker, admin: driver.AccessAdmin} {
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

	for round := range 2 { // the second round after an admin role bumped the epoch
		opID := fmt.Sprintf("op-%d-%s", round, worker)
		// worker: the protocol, nothing more.
		wd, ws := roleStore(t, rawURL, worker)
		l, err := ws.Acquire(ctx, resource, time.Minute)
		if err != nil {
			t.Fatalf("round %d: worker acquire: %v", round, err)
		}
		if l.Epoch() == l.Generation() {
			t.Fatalf("epoch %d equals generation: the test would not tell them apart", l.Epoch())
		}
		if err := l.Renew(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := l.Publish(ctx, []byte("a\x00b"), fenced.WithOpID(opID)); err != nil {
			t.Fatal(err)
		}
		if _, err := ws.Show(ctx, resource); err != nil {
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
		wantDeniedSQL(t, wd, `SELECT * FROM fenced_bump_epoch()`)
		wantDeniedSQL(t, wd, `SELECT fenced_prune(0)`)
		wantDeniedSQL(t, wd, `SELECT fenced_provision('x')`)
		wantDeniedSQL(t, wd, `UPDATE fenced_meta SET epoch = epoch + 1`)
		wantDeniedSQL(t, wd, `INSERT INTO fenced_grants (role, prefix) VALUES (session_user, '')`)

		// reader: nothing that writes.
		rd, rs := roleStore(t, rawURL, reader)
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
		gen := st.Generation
		_, err = rs.Acquire(ctx, resource, time.Minute)
		wantPermission(t, "reader acquire", err, reader, "acquire")
		_, err = rs.Resolve(ctx, "reader-"+opID)
		wantPermission(t, "reader resolve", err, reader, "resolve")
		_, err = rs.BumpEpoch(ctx)
		wantPermission(t, "reader bump", err, reader, "bump the epoch")
		if st, err := ownerStore.Show(ctx, resource); err != nil || st.Generation != gen {
			t.Fatalf("a refused acquisition changed the row: %+v, %v", st, err)
		}
		if _, found, err := ownerStore.LookupOperation(ctx, "reader-"+opID); err != nil || found {
			t.Fatalf("a refused resolve recorded the id: %v, %v", found, err)
		}
		wantDeniedSQL(t, rd, `SELECT * FROM fenced_acquire($1, 'o', 1000000)`, resource)
		wantDeniedSQL(t, rd, `SELECT * FROM fenced_resolve('x')`)
		wantDeniedSQL(t, rd, `SELECT fenced_release($1, 'o', 1, 1)`, resource)
		wantDeniedSQL(t, rd, `SELECT fenced_publish($1, 'o', 1, 1, 'x'::bytea, 0, 'op')`, resource)

		// admin: everything, the bump included.
		_, as := roleStore(t, rawURL, admin)
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

	// Granting again with a lower level takes the rest away.
	if err := ownerStore.Grant(ctx, admin, &fenced.GrantOptions{Access: driver.AccessWorker}); err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.Grant(ctx, worker, &fenced.GrantOptions{Access: driver.AccessReader}); err != nil {
		t.Fatal(err)
	}
	ad, as := roleStore(t, rawURL, admin)
	_, err = as.BumpEpoch(ctx)
	wantPermission(t, "admin regranted as worker: bump", err, admin, "bump the epoch")
	wantDeniedSQL(t, ad, `SELECT * FROM fenced_bump_epoch()`)
	if l, err := as.Acquire(ctx, resource, time.Minute); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wd, ws := roleStore(t, rawURL, worker)
	_, err = ws.Acquire(ctx, resource, time.Minute)
	wantPermission(t, "worker regranted as reader: acquire", err, worker, "acquire")
	wantDeniedSQL(t, wd, `SELECT * FROM fenced_acquire($1, 'o', 1000000)`, resource)
}

// TestGrantPrefixes: a worker limited to "a/" (and "ü/") acquires there, and cannot acquire,
// read or release under "b/": the routine refuses (FNC02) and the row does not change.
func TestGrantPrefixes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	owner := openDriver(t, rawURL)
	ownerStore, err := fenced.New(ctx, owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ownerStore.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.Provision(ctx, "a/x", "ü/y z", "b/x", "a"); err != nil {
		t.Fatal(err)
	}
	role := testRole(t, owner)
	if err := ownerStore.Grant(ctx, role, &fenced.GrantOptions{Prefixes: []string{"a/", "ü/"}}); err != nil {
		t.Fatal(err)
	}
	d, s := roleStore(t, rawURL, role)
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
		_, err = s.Acquire(ctx, r, time.Minute)
		wantPermission(t, "acquire "+r, err, role, "acquire")
		var pe *driver.PermissionError
		if errors.As(err, &pe) && pe.Resource != r {
			t.Errorf("the refusal names resource %q, want %q", pe.Resource, r)
		}
	}
	_, err = s.Show(ctx, "b/x")
	wantPermission(t, "show b/x", err, role, "read")
	if after, err := ownerStore.Show(ctx, "b/x"); err != nil || after.Generation != before.Generation || after.Owner != "" {
		t.Fatalf("a refused acquisition changed b/x: %+v -> %+v (%v)", before, after, err)
	}
	_, err = d.Pool().Exec(ctx, `SELECT * FROM fenced_acquire('b/x', 'o', 1000000)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlstatePrefix {
		t.Fatalf("direct call outside the prefixes: %v, want %s", err, sqlstatePrefix)
	}

	// Granted again without prefixes: every resource.
	if err := ownerStore.Grant(ctx, role, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "b/x", time.Minute); err != nil {
		t.Fatalf("after granting every resource: %v", err)
	}
}
