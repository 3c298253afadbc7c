package server_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/postgres/pgtest"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/server"
)

// backing is the database behind a test service.
type backing struct {
	open     func(t testing.TB) driver.Driver // a new driver on the store
	expire   func(ctx context.Context, resource string) error
	setEpoch func(ctx context.Context, epoch int64) error
	lose     func(ctx context.Context) error // destroy the store; the next open starts anew
	// holdRowLock is the engine's (drivertest.Target.HoldRowLock); nil: noRowLock says why.
	holdRowLock func(ctx context.Context, resource string, mode drivertest.RowLockMode) (drivertest.RowLock, error)
	noRowLock   string
}

// remoteTarget runs the conformance suite through a service over b: every driver the suite
// opens is a remote driver speaking HTTP to it, the lost reply is lost on the TCP connection
// between client and service, and a total loss replaces the service's store.
func remoteTarget(t *testing.T, b backing) drivertest.Target {
	return remoteTargetWith(t, b, false)
}

// remoteTargetWith is remoteTarget, with sync: through the remote driver's SyncTransport to a
// service with SyncConnections.
func remoteTargetWith(t *testing.T, b backing, sync bool) drivertest.Target {
	opts := &server.Options{UnsafeAnyPruneAge: true, SyncConnections: sync}
	open := client
	if sync {
		open = syncClient
	}
	h := startServer(t, newStore(t, b.open(t)), opts)
	return drivertest.Target{
		Open:     func(t *testing.T) driver.Driver { return open(t, h.addr, "") },
		Expire:   b.expire,
		SetEpoch: b.setEpoch,
		LostReply: func(t *testing.T) (driver.Driver, func()) {
			p := drivertest.StartProxy(t, h.addr)
			return open(t, p.Addr(), ""), p.LoseNextReply
		},
		Unreachable: func(t *testing.T) driver.Driver { return open(t, drivertest.ClosedAddr(t), "") },
		// The row-lock schedule's statements are the service's (its owner "holder ü" goes in
		// the JSON body and percent-encoded in Fenced-Owner); the lock is held by a session of
		// the engine's own, beside the service.
		HoldRowLock: b.holdRowLock,
		NoRowLock:   b.noRowLock,
		LoseEverything: func(ctx context.Context) error {
			if err := b.lose(ctx); err != nil {
				return err
			}
			// The service's process would restart on the new, empty database.
			h.serve(t, newStore(t, b.open(t)), opts)
			return nil
		},
	}
}

func sqliteBacking(t testing.TB) backing {
	path := filepath.Join(t.TempDir(), "fenced.db")
	open := func(t testing.TB) driver.Driver {
		d, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	admin := open(t).(*sqlite.Driver)
	return backing{
		noRowLock: "SQLite has no row locks: a writing statement waits for the database's one write lock",
		open:      open,
		expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, `UPDATE fenced_resources
				SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
				WHERE resource = ? AND lease_until IS NOT NULL`, resource)
			return err
		},
		setEpoch: func(ctx context.Context, epoch int64) error {
			_, err := admin.DB().ExecContext(ctx, `UPDATE fenced_meta SET epoch = ?`, epoch)
			return err
		},
		lose: func(context.Context) error {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(path + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
			return nil
		},
	}
}

func TestConformanceThroughServiceSQLite(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Target { return remoteTarget(t, sqliteBacking(t)) })
}

const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func pingPostgres(rawURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// postgresBacking gives the test a schema of its own, dropped at the end.
func postgresBacking(t testing.TB) backing {
	base := drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", defaultPostgresURL, pingPostgres)
	schema := pgx.Identifier{"fenced_srv_" + strings.ToLower(rand.Text()[:16])}.Sanitize()
	admin, err := pgx.Connect(testCtx(t), base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(testCtx(t), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		_ = admin.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", strings.Trim(schema, `"`))
	u.RawQuery = q.Encode()
	rawURL := u.String()
	return backing{
		open: func(t testing.TB) driver.Driver {
			d, err := postgres.Open(testCtx(t), rawURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			return d
		},
		expire: func(ctx context.Context, resource string) error {
			_, err := admin.Exec(ctx, `UPDATE `+schema+`.fenced_resources SET lease_until = clock_timestamp() - interval '1 second'
				WHERE resource = $1 AND lease_until IS NOT NULL`, resource)
			return err
		},
		setEpoch: func(ctx context.Context, epoch int64) error {
			_, err := admin.Exec(ctx, `UPDATE `+schema+`.fenced_meta SET epoch = $1`, epoch)
			return err
		},
		lose: func(ctx context.Context) error {
			_, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE; CREATE SCHEMA "+schema)
			return err
		},
		holdRowLock: pgtest.HoldRowLock(rawURL),
	}
}

func TestConformanceThroughServicePostgres(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Target { return remoteTarget(t, postgresBacking(t)) })
}
