package sqlserver

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/fenced-dev/fenced/driver/drivertest"
)

// The conformance suite's hooks that need a session or DDL of their own. They run only where
// FENCED_TEST_SQLSERVER names a server.

// dropStore drops every object of fenced's in the schema and the schema itself: a total loss,
// after which the next Migrate creates a new store in the same place.
func dropStore(ctx context.Context, admin *Driver) error {
	q := quoteName(admin.Schema())
	var stmts []string
	for _, rt := range routines {
		stmts = append(stmts, "DROP PROCEDURE IF EXISTS "+q+"."+quoteName(rt.procedure))
	}
	for _, t := range tables {
		stmts = append(stmts, "DROP TABLE IF EXISTS "+q+"."+quoteName(t.name))
	}
	for _, stmt := range append(stmts, "DROP SCHEMA IF EXISTS "+q) {
		if _, err := admin.DB().ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// setEpochWith overwrites the store's epoch, as a store created before epochs came from the
// clock holds a small one.
func setEpochWith(admin *Driver) func(context.Context, int64) error {
	return func(ctx context.Context, epoch int64) error {
		_, err := admin.DB().ExecContext(ctx, "UPDATE "+quoteName(admin.Schema())+".[fenced_meta] SET epoch = @epoch",
			sql.Named("epoch", epoch))
		return err
	}
}

// holdRowLockWith holds a resource's row lock in a transaction of its own session: an update
// lock taken by a read (LockOnly), or an exclusive lock taken by an update that is rolled back.
// Waiting counts the sessions blocked behind it, directly or behind another waiter.
func holdRowLockWith(admin *Driver) func(context.Context, string, drivertest.RowLockMode) (drivertest.RowLock, error) {
	return func(ctx context.Context, resource string, mode drivertest.RowLockMode) (drivertest.RowLock, error) {
		conn, err := admin.DB().Conn(ctx)
		if err != nil {
			return drivertest.RowLock{}, err
		}
		table := quoteName(admin.Schema()) + ".[fenced_resources]"
		stmt := "SELECT resource FROM " + table + " WITH (UPDLOCK, ROWLOCK) WHERE resource = @resource"
		if mode == drivertest.UpdateThenRollback {
			stmt = "UPDATE " + table + " SET payload = 0x00, published_generation = published_generation + 1 WHERE resource = @resource"
		}
		var spid int
		if err = conn.QueryRowContext(ctx, "SELECT @@SPID").Scan(&spid); err == nil {
			_, err = conn.ExecContext(ctx, "BEGIN TRANSACTION; "+stmt, sql.Named("resource", resource))
		}
		if err != nil {
			_ = conn.Close()
			return drivertest.RowLock{}, err
		}
		return drivertest.RowLock{
			Waiting: func(ctx context.Context) (int, error) {
				var n int
				err := admin.DB().QueryRowContext(ctx, `WITH w AS (
    SELECT session_id FROM sys.dm_exec_requests WHERE blocking_session_id = @spid
    UNION ALL
    SELECT r.session_id FROM sys.dm_exec_requests r JOIN w ON r.blocking_session_id = w.session_id
)
SELECT count(*) FROM w`, sql.Named("spid", spid)).Scan(&n)
				return n, err
			},
			Release: func(ctx context.Context) error {
				defer conn.Close()
				end := "COMMIT TRANSACTION"
				if mode == drivertest.UpdateThenRollback {
					end = "ROLLBACK TRANSACTION"
				}
				_, err := conn.ExecContext(ctx, end)
				return err
			},
		}, nil
	}
}
