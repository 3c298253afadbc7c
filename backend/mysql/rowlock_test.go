package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// holdRowLock is the targets' HoldRowLock: a connection of the admin's pool opens a
// transaction that locks the resource's row (FOR UPDATE) or updates it, and keeps it until
// Release commits or rolls it back.
func holdRowLock(db *sql.DB) func(context.Context, string, drivertest.RowLockMode) (drivertest.RowLock, error) {
	return func(ctx context.Context, resource string, mode drivertest.RowLockMode) (drivertest.RowLock, error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return drivertest.RowLock{}, err
		}
		var id int64
		var tx *sql.Tx
		err = conn.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id)
		if err == nil {
			tx, err = conn.BeginTx(ctx, nil)
		}
		if err == nil {
			stmt := `SELECT resource FROM fenced_resources WHERE resource = ? FOR UPDATE`
			if mode == drivertest.UpdateThenRollback {
				stmt = `UPDATE fenced_resources SET payload = 'never committed', published_generation = published_generation + 1
WHERE resource = ?`
			}
			_, err = tx.ExecContext(ctx, stmt, resource)
		}
		if err != nil {
			if tx != nil {
				_ = tx.Rollback()
			}
			_ = conn.Close()
			return drivertest.RowLock{}, err
		}
		return drivertest.RowLock{
			// Transactions waiting for the holder's, directly or behind another waiter.
			Waiting: func(ctx context.Context) (int, error) {
				var n int
				err := mysql.QueryInnoDBTrx(ctx, db, `WITH RECURSIVE w (trx_id) AS (
    SELECT trx_id FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?
    UNION
    SELECT l.requesting_trx_id FROM information_schema.INNODB_LOCK_WAITS l JOIN w ON l.blocking_trx_id = w.trx_id
)
SELECT COUNT(*) - 1 FROM w`, []any{id}, &n)
				return n, err
			},
			Release: func(ctx context.Context) error {
				defer conn.Close()
				if mode == drivertest.UpdateThenRollback {
					return tx.Rollback()
				}
				return tx.Commit()
			},
		}, nil
	}
}

// TestSuiteCatchesClockAtStatementStart runs RowLockAcrossExpiry in a child process against
// statements that judge expiry with UTC_TIMESTAMP(6), read when the statement starts (the
// mutant in rowlock_internal_test.go), directly and through the procedures: it must fail, for
// both lock modes.
func TestSuiteCatchesClockAtStatementStart(t *testing.T) {
	if os.Getenv("FENCED_MUTANT") != "" {
		t.Skip("running as a mutant child")
	}
	mysql.CreateTestDatabase(t) // skips loudly without a server
	for _, run := range []string{"^TestConformance$/^RowLockAcrossExpiry$", "^TestConformanceGrantedRole$/^RowLockAcrossExpiry$"} {
		t.Run(run, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run", run, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "FENCED_MUTANT=clock-at-statement-start")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("RowLockAcrossExpiry passed against statements that read the clock when they start:\n%s", out)
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
