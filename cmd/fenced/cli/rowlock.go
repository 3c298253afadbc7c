package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/driver"
)

// heldRow is a resource's row locked by the nemesis, and the lease it read under the lock.
type heldRow struct {
	owner       string
	epoch, gen  int64
	remainingUs int64 // until the lease expires, on the database's clock; 0 when none is held
	release     func(ctx context.Context) error
}

// lockRow locks resource's row in a transaction of its own: FOR UPDATE, or (rollback) an
// UPDATE that release rolls back. The lease is read by a second statement, once the lock is
// held, so that its clock reading follows any wait.
func lockRow(ctx context.Context, drv driver.Driver, resource string, rollback bool) (heldRow, error) {
	switch d := drv.(type) {
	case *postgres.Driver:
		tx, err := d.Pool().Begin(ctx)
		if err != nil {
			return heldRow{}, err
		}
		stmt := `SELECT FROM fenced_resources WHERE resource = $1 FOR UPDATE`
		if rollback {
			stmt = `UPDATE fenced_resources SET published_generation = published_generation WHERE resource = $1`
		}
		h := heldRow{release: func(ctx context.Context) error {
			if rollback {
				return tx.Rollback(ctx)
			}
			return tx.Commit(ctx)
		}}
		_, err = tx.Exec(ctx, stmt, resource)
		if err == nil {
			err = tx.QueryRow(ctx, `SELECT coalesce(lease_owner, ''), epoch, generation,
    coalesce((extract(epoch FROM lease_until - clock_timestamp()) * 1000000)::bigint, 0)
FROM fenced_resources WHERE resource = $1`, resource).Scan(&h.owner, &h.epoch, &h.gen, &h.remainingUs)
		}
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return heldRow{}, err
		}
		return h, nil
	case *mysql.Driver:
		tx, err := d.DB().BeginTx(ctx, nil)
		if err != nil {
			return heldRow{}, err
		}
		stmt := `SELECT resource FROM fenced_resources WHERE resource = ? FOR UPDATE`
		if rollback {
			stmt = `UPDATE fenced_resources SET published_generation = published_generation WHERE resource = ?`
		}
		h := heldRow{release: func(context.Context) error {
			if rollback {
				return tx.Rollback()
			}
			return tx.Commit()
		}}
		_, err = tx.ExecContext(ctx, stmt, resource)
		if err == nil {
			var owner sql.NullString
			err = tx.QueryRowContext(ctx, `SELECT lease_owner, epoch, generation,
    COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until), 0)
FROM fenced_resources WHERE resource = ? FOR UPDATE`, resource).Scan(&owner, &h.epoch, &h.gen, &h.remainingUs)
			h.owner = owner.String
		}
		if err != nil {
			_ = tx.Rollback()
			return heldRow{}, err
		}
		return h, nil
	}
	return heldRow{}, errors.New("the rowlock fault needs PostgreSQL or MariaDB")
}

// holdRowLock is the rowlock fault: it waits (up to 2s) until the resource has a lease with
// some time left, holds the row's lock until a moment after that lease has expired, and
// records the lease, when the lock was held, when the lease expired at the latest and when
// the lock was let go. A renewal or a publication of that lease made meanwhile waits on the
// lock and must be refused once it runs (checked by torture.Check).
func (t *tortureRun) holdRowLock(ctx context.Context, f torture.Fault) {
	resource := t.resources[f.Slot%len(t.resources)]
	how := "FOR UPDATE, then commit"
	if f.Rollback {
		how = "UPDATE, then roll back"
	}
	giveUp := time.Now().Add(2 * time.Second)
	for {
		h, err := lockRow(ctx, t.drv, resource, f.Rollback)
		locked := torture.Now()
		if err != nil {
			_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "error", Detail: "rowlock: " + err.Error()})
			return
		}
		if h.owner == "" || h.remainingUs < 50_000 { // no lease to hold across its expiry
			_ = h.release(ctx)
			if time.Now().After(giveUp) || !wait(ctx, 20*time.Millisecond) {
				_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultRowLock, Resource: resource,
					Time: locked, EndTime: torture.Now(), Detail: "no live lease to hold across its expiry within 2s"})
				return
			}
			continue
		}
		until := locked + h.remainingUs*1000
		wait(ctx, time.Duration(until-torture.Now())+150*time.Millisecond)
		end := torture.Now()
		err = h.release(context.WithoutCancel(ctx))
		detail := fmt.Sprintf("%s: held %s's row (generation %d) across its lease's expiry", how, resource, h.gen)
		if err != nil {
			detail += "; release: " + err.Error()
		}
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultRowLock, Resource: resource,
			Owner: h.owner, Epoch: h.epoch, Gen: h.gen, Time: locked, EndTime: end, Until: until, Detail: detail})
		return
	}
}
