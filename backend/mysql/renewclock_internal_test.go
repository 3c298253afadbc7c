package mysql

import (
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// TestRenewReturnsDecidingClock: the expiry a renewal returns is the clock reading that judged
// the lease live, plus the ttl. The schedule is forced inside the statement: SLEEP(0.3) runs
// after the lease's comparison and before SET, on a lease with 100 ms left; a SET that read
// the clock again would return an expiry whose start (expiry − ttl) lies about 200 ms after
// the lease's expiry, which is what the torture checker reads as a renewal of an expired lease
// (invariant 6). Mutant: SET reading clockAfterLockMicros again fails it.
func TestRenewReturnsDecidingClock(t *testing.T) {
	t.Parallel()
	d := migrated(t)
	ctx := ctxFor(t)
	res := "renew clock \x00 ü"
	if err := d.Provision(ctx, res); err != nil {
		t.Fatal(err)
	}
	if _, err := d.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, res, "owner ü 1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var until int64
	if _, err := d.db.ExecContext(ctx, `UPDATE fenced_resources SET lease_until = `+clockAfterLock+
		` + INTERVAL 100000 MICROSECOND WHERE resource = ?`, res); err != nil {
		t.Fatal(err)
	}
	if err := d.db.QueryRowContext(ctx, `SELECT `+micros("lease_until")+` FROM fenced_resources WHERE resource = ?`, res).Scan(&until); err != nil {
		t.Fatal(err)
	}
	slow := *sqlRenew
	slow.sql += " AND SLEEP(0.3) = 0"
	p := leaseParams(driver.LeaseRef{Resource: res, Owner: "owner ü 1", Epoch: g.Epoch, Generation: g.Generation})
	ttl := time.Second
	p.ttl = ttl.Microseconds()
	matched, newUntil, err := run(ctx, d.db, false, &slow, p)
	if err != nil {
		t.Fatal(err)
	}
	if matched != 1 {
		t.Fatalf("renewal of a lease with 100 ms left matched %d rows", matched)
	}
	if decided := newUntil - ttl.Microseconds(); decided >= until {
		t.Errorf("renewal returned an expiry whose start is %v after the lease's expiry: SET read the clock again",
			time.Duration(decided-until)*time.Microsecond)
	}
}
