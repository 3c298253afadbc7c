// Package pgtest holds test helpers for targets over a PostgreSQL store, shared by the
// backend's own tests and the service's (which runs the suite through a server on PostgreSQL).
package pgtest

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/driver/drivertest"
)

// HoldRowLock is a conformance target's HoldRowLock on the store at rawURL: a connection of its own (as the schema's owner)
// opens a transaction that locks the resource's row (FOR UPDATE) or updates it, and keeps it
// until Release commits or rolls it back.
func HoldRowLock(rawURL string) func(context.Context, string, drivertest.RowLockMode) (drivertest.RowLock, error) {
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
