package sqlite

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deleteDatabase deletes the database file and its WAL files, as a user would.
func deleteDatabase(path string) error {
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// newTarget gives each test its own database file.
func newTarget(t *testing.T) drivertest.Target {
	path := filepath.Join(t.TempDir(), "fenced.db")
	open := func(t *testing.T) *Driver {
		d, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	admin := open(t)
	return drivertest.Target{
		// The file is deleted as a user would delete it; connections still open on it keep the
		// deleted inode, and the next Open creates a new file.
		LoseEverything: func(context.Context) error { return deleteDatabase(path) },
		SetEpoch: func(ctx context.Context, epoch int64) error {
			_, err := admin.DB().ExecContext(ctx, `UPDATE fenced_meta SET epoch = ?`, epoch)
			return err
		},
		Open:      func(t *testing.T) driver.Driver { return mutate(open(t)) },
		LostReply: func(t *testing.T) (driver.Driver, func()) { return drivertest.LoseReplies(open(t)) },
		NoRowLock: "SQLite has no row locks: a writing statement waits for the database's one write lock " +
			"before it reads any row or the clock, so no statement can wait on a lock while holding an earlier reading",
		Expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, `UPDATE fenced_resources
				SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
				WHERE resource = ? AND lease_until IS NOT NULL`, resource)
			return err
		},
	}
}

func TestConformance(t *testing.T) { drivertest.Run(t, newTarget) }
