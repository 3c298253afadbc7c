package postgres

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The statements before the epoch-bump fix (acquisition reading the epoch from its snapshot,
// lease-carrying statements comparing only the row's epoch), kept as the benchmark's baseline.
var (
	preFixAcquire = `WITH acquired AS (
    UPDATE fenced_resources
    SET generation = generation + 1, epoch = ` + currentEpoch + `, lease_owner = $2,
        lease_until = clock_timestamp() + $3::bigint ` + ttlInterval + `
    WHERE resource = $1 AND (lease_until IS NULL OR lease_until <= clock_timestamp()) AND ` + incarnationOK + `
    RETURNING epoch, generation, lease_until
)
SELECT true, epoch, generation, lease_until, false FROM acquired
UNION ALL
SELECT false, epoch, generation, lease_until, (lease_until IS NULL OR lease_until <= clock_timestamp())
FROM fenced_resources
WHERE resource = $1 AND NOT EXISTS (SELECT FROM acquired)`
	preFixRenew   = strings.Replace(sqlRenew, ` AND $4 = `+currentEpoch, "", 1)
	preFixRelease = strings.Replace(sqlRelease, ` AND $4 = `+currentEpoch, "", 1)
)

// BenchmarkEpochLock compares one acquire, renew, release cycle with the statements before and
// after the fix (the epoch locked FOR SHARE by the acquisition, the store's epoch compared by
// the renewal and the release), on one connection, in direct mode. Run with:
// go test -run '^$' -bench EpochLock -count 6 ./backend/postgres/ | benchstat -col /stmt -
func BenchmarkEpochLock(b *testing.B) {
	if preFixRenew == sqlRenew || preFixRelease == sqlRelease {
		b.Fatal("the baseline statements equal the current ones")
	}
	rawURL := testSchema(b, nil)
	d := openDriver(b, rawURL)
	ctx := context.Background()
	if err := d.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	const resource = "bench ⚖"
	if err := d.Provision(ctx, resource); err != nil {
		b.Fatal(err)
	}
	if _, err := d.BumpEpoch(ctx); err != nil {
		b.Fatal(err)
	}
	for _, v := range []struct{ name, acquire, renew, release string }{
		{"before", preFixAcquire, preFixRenew, preFixRelease},
		{"after", sqlAcquire, sqlRenew, sqlRelease},
	} {
		b.Run("stmt="+v.name, func(b *testing.B) {
			for b.Loop() {
				var (
					acquired, seenFree bool
					epoch, gen         int64
					until              time.Time
				)
				if err := d.Pool().QueryRow(ctx, v.acquire, resource, "o", time.Minute.Microseconds()).
					Scan(&acquired, &epoch, &gen, &until, &seenFree); err != nil || !acquired {
					b.Fatalf("acquire: %v, %v", acquired, err)
				}
				if err := d.Pool().QueryRow(ctx, v.renew, resource, "o", gen, epoch, time.Minute.Microseconds()).Scan(&until); err != nil {
					b.Fatalf("renew: %v", err)
				}
				if tag, err := d.Pool().Exec(ctx, v.release, resource, "o", gen, epoch); err != nil || tag.RowsAffected() != 1 {
					b.Fatalf("release: %v, %v", tag, err)
				}
			}
		})
	}
}
