package artifact

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/jackc/pgx/v5"
	"gocloud.dev/blob/azureblob"
)

// The tests run every schedule on each blob store and each pointer home below.

// home is a database holding the pointers.
type home struct {
	name string
	// open returns a store on connections of its own, and the same store whose next mutation's
	// reply is lost once arm is called.
	open   func(t testing.TB) (s *fenced.Store, lossy *fenced.Store, arm func())
	expire func(ctx context.Context, resource string) error
	// copyRow copies the resource's row as it is now; restore puts the copy back, as restoring
	// the database from a copy taken at that moment would (nil: not built for this home).
	copyRow func(ctx context.Context, resource string) (restore func(ctx context.Context) error, err error)
}

// sqlRowCopy copies a row of fenced_resources (table, qualified as the admin connection
// needs) into a table of its own and puts it back in one transaction.
func sqlRowCopy(exec func(ctx context.Context, stmts ...string) error, table, resource string) func(ctx context.Context) (func(ctx context.Context) error, error) {
	return func(ctx context.Context) (func(ctx context.Context) error, error) {
		copyTable := table + "_copy_" + strings.ToLower(rand.Text()[:8])
		lit := "'" + strings.ReplaceAll(resource, "'", "''") + "'"
		if err := exec(ctx, "CREATE TABLE "+copyTable+" AS SELECT * FROM "+table+" WHERE resource = "+lit); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			return exec(ctx, "DELETE FROM "+table+" WHERE resource = "+lit, "INSERT INTO "+table+" SELECT * FROM "+copyTable)
		}, nil
	}
}

// dbExec runs stmts in one transaction.
func dbExec(db *sql.DB) func(ctx context.Context, stmts ...string) error {
	return func(ctx context.Context, stmts ...string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for _, st := range stmts {
			if _, err := tx.ExecContext(ctx, st); err != nil {
				_ = tx.Rollback()
				return err
			}
		}
		return tx.Commit()
	}
}

type store struct {
	name string
	open func(t *testing.T) *Bucket
	// corrupt replaces the object's bytes behind fenced's back, as a faulty disk or an operator
	// could.
	corrupt func(t *testing.T, b *Bucket, key string, data []byte)
}

type namedHome struct {
	name string
	open func(t testing.TB) home
}

func homes() []namedHome {
	return []namedHome{{"sqlite", sqliteHome}, {"postgres", postgresHome}, {"mariadb", mariadbHome}, {"redis", redisHome}, {"etcd", etcdHome}}
}
func stores() []store { return []store{fileStore, azuriteStore} }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newStore(t testing.TB, drv driver.Driver) *fenced.Store { return newStoreWith(t, drv, nil) }

func newStoreWith(t testing.TB, drv driver.Driver, cfg *fenced.Config) *fenced.Store {
	t.Helper()
	s, err := fenced.New(testCtx(t), drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func sqliteHome(t testing.TB) home {
	path := filepath.Join(t.TempDir(), "fenced.db")
	open := func(t testing.TB) *sqlite.Driver {
		d, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	admin := open(t)
	t.Cleanup(func() { _ = admin.Close() })
	return home{
		name: "sqlite",
		open: func(t testing.TB) (*fenced.Store, *fenced.Store, func()) {
			lossy, arm := drivertest.LoseReplies(open(t))
			return newStore(t, open(t)), newStore(t, lossy), arm
		},
		expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, `UPDATE fenced_resources
				SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
				WHERE resource = ? AND lease_until IS NOT NULL`, resource)
			return err
		},
		copyRow: func(ctx context.Context, resource string) (func(ctx context.Context) error, error) {
			return sqlRowCopy(dbExec(admin.DB()), "fenced_resources", resource)(ctx)
		},
	}
}

func pgPing(rawURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func postgresHome(t testing.TB) home {
	base := drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", pgPing)
	schema := "fenced_artifact_" + strings.ToLower(rand.Text()[:16])
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
			t.Errorf("drop schema %s: %v", schema, err)
		}
		_ = admin.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	open := func(t testing.TB) *postgres.Driver {
		d, err := postgres.Open(testCtx(t), u.String())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return home{
		name: "postgres",
		open: func(t testing.TB) (*fenced.Store, *fenced.Store, func()) {
			lossy, arm := drivertest.LoseReplies(open(t))
			return newStore(t, open(t)), newStore(t, lossy), arm
		},
		expire: func(ctx context.Context, resource string) error {
			_, err := admin.Exec(ctx, `UPDATE `+schema+`.fenced_resources SET lease_until = clock_timestamp() - interval '1 second'
				WHERE resource = $1 AND lease_until IS NOT NULL`, resource)
			return err
		},
		copyRow: func(ctx context.Context, resource string) (func(ctx context.Context) error, error) {
			exec := func(ctx context.Context, stmts ...string) error {
				return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
					for _, st := range stmts {
						if _, err := tx.Exec(ctx, st); err != nil {
							return err
						}
					}
					return nil
				})
			}
			return sqlRowCopy(exec, schema+".fenced_resources", resource)(ctx)
		},
	}
}

var fileStore = store{
	name: "file",
	open: func(t *testing.T) *Bucket {
		b, err := OpenBucket(testCtx(t), FileURL(t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	},
	corrupt: func(t *testing.T, b *Bucket, key string, data []byte) {
		path := filepath.Join(b.dir, filepath.FromSlash(key))
		if err := os.Remove(path); err != nil { // a new file: a hard link may share the inode
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o666); err != nil {
			t.Fatal(err)
		}
	},
}

// Azurite's well-known development account.
const (
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// azuriteURL is the blob endpoint of an Azurite server, from FENCED_TEST_AZURITE (.ci/run
// starts one).
func azuriteURL(t *testing.T) string {
	return drivertest.ServerURL(t, "FENCED_TEST_AZURITE", "http://127.0.0.1:10000/"+azuriteAccount, drivertest.DialURL)
}

// azuriteContainer creates a container with a random name, deleted when the test ends.
func azuriteContainer(t *testing.T) (serviceURL, name string) {
	serviceURL = strings.TrimSuffix(azuriteURL(t), "/") + "/"
	cred, err := azblob.NewSharedKeyCredential(azuriteAccount, azuriteKey)
	if err != nil {
		t.Fatal(err)
	}
	client, err := azblob.NewClientWithSharedKeyCredential(serviceURL, cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	name = "fenced-" + strings.ToLower(rand.Text()[:20])
	if _, err := client.CreateContainer(testCtx(t), name, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := client.DeleteContainer(ctx, name, nil); err != nil {
			t.Errorf("delete container %s: %v", name, err)
		}
	})
	return serviceURL, name
}

var azuriteStore = store{
	name: "azurite",
	open: func(t *testing.T) *Bucket {
		serviceURL, name := azuriteContainer(t)
		cred, err := azblob.NewSharedKeyCredential(azuriteAccount, azuriteKey)
		if err != nil {
			t.Fatal(err)
		}
		c, err := azblob.NewClientWithSharedKeyCredential(serviceURL, cred, nil)
		if err != nil {
			t.Fatal(err)
		}
		bb, err := azureblob.OpenBucket(testCtx(t), c.ServiceClient().NewContainerClient(name), nil)
		if err != nil {
			t.Fatal(err)
		}
		b := NewBucket(bb)
		t.Cleanup(func() { _ = b.Close() })
		return b
	},
	corrupt: func(t *testing.T, b *Bucket, key string, data []byte) {
		if err := b.b.WriteAll(testCtx(t), key, data, nil); err != nil { // unconditional overwrite
			t.Fatal(err)
		}
	},
}
