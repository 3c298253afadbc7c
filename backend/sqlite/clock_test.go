package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// TestConformanceClockOffset runs the suite with the clock offset hook in place (offset 0):
// the rewritten statements must behave exactly as the default ones.
func TestConformanceClockOffset(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Target {
		dir := t.TempDir()
		path, clock := filepath.Join(dir, "fenced.db"), filepath.Join(dir, "clock")
		open := func(t *testing.T) *Driver {
			d, err := Open(path, WithClockOffsetFile(clock))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			return d
		}
		admin := open(t)
		return drivertest.Target{
			Open:           func(t *testing.T) driver.Driver { return open(t) },
			LostReply:      func(t *testing.T) (driver.Driver, func()) { return drivertest.LoseReplies(open(t)) },
			LoseEverything: func(context.Context) error { return deleteDatabase(path) },
			NoRowLock: "SQLite has no row locks: a writing statement waits for the database's one write lock " +
				"before it reads any row or the clock, so no statement can wait on a lock while holding an earlier reading",
			Expire: func(ctx context.Context, resource string) error {
				_, err := admin.DB().ExecContext(ctx, admin.q(`UPDATE fenced_resources
					SET lease_until = `+nowMicros+` - 1000000
					WHERE resource = ? AND lease_until IS NOT NULL`), resource)
				return err
			},
		}
	})
}

// TestClockOffset jumps the clock forward past a lease, then back: every statement, in every
// driver sharing the offset file, follows the jump.
func TestClockOffset(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := filepath.Join(dir, "clock")
	open := func() *Driver {
		d, err := Open(filepath.Join(dir, "fenced.db"), WithClockOffsetFile(clock))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	a, b := open(), open()
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	setOffset := func(d time.Duration) {
		if err := os.WriteFile(clock, []byte(strconv.FormatInt(d.Microseconds(), 10)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before, err := a.Read(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "r", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	var busy *driver.BusyError
	if _, err := b.Acquire(ctx, "r", "B", time.Hour); !errors.As(err, &busy) {
		t.Fatalf("acquire under a held lease: %v, want busy", err)
	}
	setOffset(2 * time.Hour) // forward past A's lease
	st, err := b.Read(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if jump := st.Now.Sub(before.Now); jump < 2*time.Hour || jump > 2*time.Hour+time.Minute {
		t.Fatalf("the database clock moved by %s, want about 2h", jump)
	}
	if _, err := b.Acquire(ctx, "r", "B", time.Hour); err != nil {
		t.Fatalf("acquire after the clock jumped past the lease: %v", err)
	}
	setOffset(0) // back: B's lease now ends 3h from now, so it is still held
	if _, err := a.Acquire(ctx, "r", "C", time.Hour); !errors.As(err, &busy) {
		t.Fatalf("acquire after the clock jumped back: %v, want busy", err)
	}
	if _, ok, err := a.Renew(ctx, driver.LeaseRef{Resource: "r", Owner: "A", Generation: 1}, time.Hour); ok || err != nil {
		t.Fatalf("renewal of the superseded lease: ok=%v err=%v", ok, err)
	}
}

// TestEpochIgnoresClockOffset: the offset that moves expiry (a torture clock jump) does not
// move epochs, which come from the real clock: an hour back, a bump still reaches now.
func TestEpochIgnoresClockOffset(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := filepath.Join(dir, "clock")
	if err := os.WriteFile(clock, []byte(strconv.FormatInt(-time.Hour.Microseconds(), 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Open(filepath.Join(dir, "fenced.db"), WithClockOffsetFile(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMicro()
	epoch, err := d.BumpEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if epoch < before {
		t.Fatalf("bumped to %d with the clock offset an hour back; want at least the real clock %d", epoch, before)
	}
}
