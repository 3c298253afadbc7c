package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/driver"
)

// Mutants of the protocol, for showing that torture's clock checks catch the bugs they are
// about (fenced torture --mutant, hidden; used by the tests only).
const (
	// mutantRenewAfterExpiry renews without the expiry condition (SQLite).
	mutantRenewAfterExpiry = "renew-after-expiry"
	// mutantBusyAfterExpiry answers busy whenever the row names an owner, expired or not.
	mutantBusyAfterExpiry = "busy-after-expiry"
)

// mutate wraps drv in the named mutant.
func mutate(drv driver.Driver, name string) (driver.Driver, error) {
	switch name {
	case "":
		return drv, nil
	case mutantRenewAfterExpiry:
		d, ok := drv.(*sqlite.Driver)
		if !ok {
			return nil, usagef("the %s mutant needs SQLite", name)
		}
		return &renewMutant{Driver: drv, d: d}, nil
	case mutantBusyAfterExpiry:
		return &busyMutant{Driver: drv}, nil
	}
	return nil, usagef("unknown mutant %q", name)
}

// renewMutant is the renewal statement without "AND lease_until > now": a lease that expired
// with nobody taking over is revived.
type renewMutant struct {
	driver.Driver
	d *sqlite.Driver
}

func (m *renewMutant) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	var until int64
	err := m.d.DB().QueryRowContext(ctx, `UPDATE fenced_resources
SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?
WHERE resource = ? AND lease_owner = ? AND epoch = ? AND generation = ?
RETURNING lease_until`, ttl.Microseconds(), l.Resource, l.Owner, l.Epoch, l.Generation).Scan(&until)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return time.Time{}, false, nil
		}
		return time.Time{}, false, fmt.Errorf("mutant renew: %w", err)
	}
	return time.UnixMicro(until), true, nil
}

// busyMutant answers busy from a read whenever the row names an owner, without looking at the
// lease's expiry: an expired lease blocks the resource for ever.
type busyMutant struct{ driver.Driver }

func (m *busyMutant) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	st, err := m.Read(ctx, resource)
	if err != nil {
		return driver.Grant{}, err
	}
	if st.Owner != "" {
		return driver.Grant{}, &driver.BusyError{Epoch: st.Epoch, Generation: st.Generation, LeaseUntil: st.LeaseUntil}
	}
	return m.Driver.Acquire(ctx, resource, owner, ttl)
}
