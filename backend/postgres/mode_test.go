package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/driver"
)

// TestModeDetection: the schema's owner sends the statements themselves, a role that Grant set
// up calls the routines, and before Migrate nothing is decided. Each driver has one connection,
// whose prepared statements show what it sent.
func TestModeDetection(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, map[string]string{"pool_max_conns": "1"})

	fresh := openDriver(t, rawURL)
	if _, err := fresh.Read(ctx, "r"); err == nil {
		t.Fatal("read before Migrate succeeded")
	}
	if m := fresh.mode.Load(); m != modeUnknown {
		t.Fatalf("mode %d before Migrate, want it undecided", m)
	}

	owner := openDriver(t, rawURL)
	migrateAndAcquire(t, owner)
	role := testRole(t, owner)
	if err := owner.Grant(ctx, role, adminSpec); err != nil {
		t.Fatal(err)
	}
	granted := openDriver(t, asRole(t, rawURL, role))
	if err := granted.Provision(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := granted.Acquire(ctx, "g", "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Read(ctx, "r"); err != nil { // decided now that the schema exists
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name string
		d    *Driver
		mode int32
		sent string
	}{
		{"owner", owner, modeDirect, sqlAcquire},
		{"granted role", granted, modeRoutines, rtAcquire.call()},
		{"owner, after Migrate", fresh, modeDirect, sqlRead},
	} {
		if m := tt.d.mode.Load(); m != tt.mode {
			t.Errorf("%s: mode %d, want %d", tt.name, m, tt.mode)
		}
		rows, err := tt.d.Pool().Query(ctx, `SELECT statement FROM pg_prepared_statements`)
		if err != nil {
			t.Fatal(err)
		}
		sent, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(sent, tt.sent) {
			t.Errorf("%s: the connection did not prepare\n%s\nbut\n%s", tt.name, tt.sent, strings.Join(sent, "\n---\n"))
		}
	}
}

// leaseStatements are the statements that carry the incarnation check, with arguments that
// match no row.
var leaseStatements = map[string]struct {
	rt   routine
	args []any
}{
	"acquire":             {rtAcquire, []any{"missing", "o", int64(1e6)}},
	"renew":               {rtRenew, []any{"missing", "o", int64(1), int64(1), int64(1e6)}},
	"publish":             {rtPublish, []any{"missing", "o", int64(1), int64(1), []byte("p"), int64(0), "op"}},
	"publish-and-release": {rtPublishAndRelease, []any{"missing", "o", int64(1), int64(1), []byte("p"), int64(0), "op"}},
	"release":             {rtRelease, []any{"missing", "o", int64(1), int64(1)}},
}

// TestIncarnationCheckOncePerStatement: in each lease-carrying statement the incarnation check
// is an InitPlan whose result is a one-time filter above the scan, not a condition evaluated
// per row, in the custom plan and in the generic one (the statements are prepared). It
// therefore raises when the incarnation differs even if no row matches, in both modes.
func TestIncarnationCheckOncePerStatement(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	owner := openDriver(t, rawURL)
	if err := owner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for name, st := range leaseStatements {
		for _, planCache := range []string{"force_custom_plan", "force_generic_plan"} {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+planCache); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "PREPARE fenced_explain AS "+st.rt.statement); err != nil {
				t.Fatalf("prepare %s: %v", name, err)
			}
			var params []string
			for i := range st.args {
				params = append(params, fmt.Sprintf("$%d", i+1))
			}
			rows, err := conn.Query(ctx, "EXPLAIN (VERBOSE, COSTS OFF) EXECUTE fenced_explain("+strings.Join(params, ", ")+")",
				append([]any{pgx.QueryExecModeSimpleProtocol}, st.args...)...) // EXECUTE's arguments are not parameters
			if err != nil {
				t.Fatalf("explain %s: %v", name, err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "DEALLOCATE fenced_explain"); err != nil {
				t.Fatal(err)
			}
			plan := strings.Join(lines, "\n")
			// The check is the output of an InitPlan's Result, and its parameter is the first
			// operand of the one-time filter (so that no other condition short-circuits it).
			param, calls, filters := "", 0, 0
			for i, l := range lines {
				if !strings.Contains(l, "fenced_incarnation_ok") {
					continue
				}
				calls++
				if i >= 2 && strings.Contains(l, "Output: fenced_incarnation_ok()") {
					if _, after, ok := strings.Cut(lines[i-2], "InitPlan "); ok {
						if _, p, ok := strings.Cut(after, "(returns "); ok {
							param = strings.TrimSuffix(p, ")")
						}
					}
				}
			}
			for _, l := range lines {
				if _, f, ok := strings.Cut(l, "One-Time Filter: "); ok && param != "" &&
					(f == param || strings.HasPrefix(f, "("+param+" AND ")) {
					filters++
				}
			}
			if calls != 1 || param == "" || filters != 1 {
				t.Errorf("%s (%s): the check appears %d times, as InitPlan %q, first in %d one-time filters; want once, as the first operand of a one-time filter:\n%s",
					name, planCache, calls, param, filters, plan)
			}
		}
	}

	// A different incarnation raises although no row matches: as the owner (statements) and as
	// a granted role (routines, whose bodies are the same statements).
	role := testRole(t, owner)
	if err := owner.Grant(ctx, role, adminSpec); err != nil {
		t.Fatal(err)
	}
	granted := openDriver(t, asRole(t, rawURL, role))
	if _, err := owner.Pool().Exec(ctx, `UPDATE fenced_meta SET timeline = timeline - 1`); err != nil {
		t.Fatal(err)
	}
	ref := driver.LeaseRef{Resource: "missing", Owner: "o", Epoch: 1, Generation: 1}
	for who, d := range map[string]*Driver{"owner": owner, "granted role": granted} {
		_, acquireErr := d.Acquire(ctx, "missing", "o", time.Minute)
		_, renewed, renewErr := d.Renew(ctx, ref, time.Minute)
		published, publishErr := d.Publish(ctx, ref, driver.Publication{Payload: []byte("p"), OpID: "op1"})
		both, bothErr := d.PublishAndRelease(ctx, ref, driver.Publication{Payload: []byte("p"), OpID: "op2"})
		released, releaseErr := d.Release(ctx, ref)
		for what, err := range map[string]error{
			"acquire": acquireErr, "renew": renewErr, "publish": publishErr, "publish and release": bothErr, "release": releaseErr,
		} {
			if !errors.Is(err, driver.ErrIncarnationChanged) || !errors.Is(err, driver.ErrNotApplied) {
				t.Errorf("%s: %s of a missing resource after the incarnation changed: %v, want not applied (incarnation changed)", who, what, err)
			}
		}
		if renewed || published || both || released {
			t.Errorf("%s: an operation succeeded after the incarnation changed", who)
		}
	}
	if owner.mode.Load() != modeDirect || granted.mode.Load() != modeRoutines {
		t.Fatalf("modes %d and %d, want direct for the owner and routines for the granted role", owner.mode.Load(), granted.mode.Load())
	}
}
