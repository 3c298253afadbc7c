package postgres

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/driver/drivertest"
)

// holdRowLock is the targets' HoldRowLock: a connection of its own (as the schema's owner)
// opens a transaction that locks the resource's row (FOR UPDATE) or updates it, and keeps it
// until Release commits or rolls it back.
func holdRowLock(rawURL string) func(context.Context, string, drivertest.RowLockMode) (drivertest.RowLock, error) {
	return func(ctx context.Context, resource string, mode drivertest.RowLockMode) (drivertest.RowLock, error) {
		conn, err := pgx.Connect(ctx, rawURL)
		if err != nil {
			return drivertest.RowLock{}, err
		}
		tx, err := conn.Begin(ctx)
		if err == nil {
			stmt := `SELECT FROM fenced_resources WHERE resource = $1 FOR UPDATE`
			if mode == drivertest.UpdateThenRollback {
				stmt = `UPDATE fenced_resources SET payload = 'never committed'::bytea, published_generation = published_generation + 1 WHERE resource = $1`
			}
			_, err = tx.Exec(ctx, stmt, resource)
		}
		if err != nil {
			_ = conn.Close(context.Background())
			return drivertest.RowLock{}, err
		}
		holder := int32(conn.PgConn().PID())
		return drivertest.RowLock{
			// Sessions waiting for the holder, directly or behind another waiter: the second
			// waiter on a row waits for the first one's tuple lock.
			Waiting: func(ctx context.Context) (int, error) {
				watcher, err := pgx.Connect(ctx, rawURL)
				if err != nil {
					return 0, err
				}
				defer watcher.Close(context.Background())
				var n int
				err = watcher.QueryRow(ctx, `WITH RECURSIVE w(pid) AS (
    SELECT $1::int
    UNION
    SELECT a.pid FROM pg_stat_activity a JOIN w ON w.pid = ANY(pg_blocking_pids(a.pid))
)
SELECT count(*) - 1 FROM w`, holder).Scan(&n)
				return n, err
			},
			Release: func(ctx context.Context) error {
				defer conn.Close(context.Background())
				if mode == drivertest.UpdateThenRollback {
					return tx.Rollback(ctx)
				}
				return tx.Commit(ctx)
			},
		}, nil
	}
}

// The conformance suite must be able to fail: with FENCED_MUTANT=no-row-lock the renewal and
// the publication run without sqlLockRow first, as before the fix, in both modes (the
// routines Migrate installs are built from the same, mutated, definitions).
func init() {
	if os.Getenv("FENCED_MUTANT") != "no-row-lock" {
		return
	}
	rtRenew.lockFirst, rtPublish.lockFirst, rtPublishAndRelease.lockFirst = false, false, false
	for i := range routines {
		routines[i].lockFirst = false
	}
}

// TestSuiteCatchesClockBeforeRowLock runs RowLockAcrossExpiry in a child process against the
// statements without the row lock first, directly and as a granted role: it must fail, for
// both lock modes (PostgreSQL re-checks the condition after the wait in neither).
func TestSuiteCatchesClockBeforeRowLock(t *testing.T) {
	if os.Getenv("FENCED_MUTANT") != "" {
		t.Skip("running as a mutant child")
	}
	testSchema(t, nil) // skips loudly without a server
	for _, run := range []string{"^TestConformance$/^RowLockAcrossExpiry$", "^TestConformanceAsGrantedRole$/^read-committed$/^RowLockAcrossExpiry$"} {
		t.Run(run, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run", run, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "FENCED_MUTANT=no-row-lock")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("RowLockAcrossExpiry passed against statements that read the clock before the row lock:\n%s", out)
			}
			// Whichever of the two gets the lock first acts on the expired lease; the other
			// may then see the row it changed, so only one is certain to be accepted.
			for _, mode := range []string{"LockOnly", "UpdateThenRollback"} {
				want := "that waited on the row lock (" + mode + ") until after the lease expired was accepted"
				if !strings.Contains(string(out), want) {
					t.Errorf("the child did not report %q:\n%s", want, out)
				}
			}
		})
	}
}
