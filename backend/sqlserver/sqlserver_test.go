package sqlserver

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// envURL names the server the conformance suite and the benchmarks run against, as
// sqlserver://user:password@host:port?database=NAME. The database must exist; each test makes
// its own schema in it and drops it afterwards.
const envURL = "FENCED_TEST_SQLSERVER"

// serverURL returns the server's URL or skips. Unlike drivertest.ServerURL it skips under
// CI=true as well: no SQL Server can be installed where this project's CI runs.
func serverURL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(envURL)
	if u == "" {
		tb.Skip("!!! SQL Server tests SKIPPED: " + envURL + " is not set. SQL Server is not run in CI " +
			"here, so this backend's conformance suite and benchmarks run only where " + envURL +
			"=sqlserver://user:password@host:port?database=NAME names a server.")
	}
	return u
}

// withSchema returns rawURL with fenced's schema parameter set.
func withSchema(tb testing.TB, rawURL, schema string) string {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatalf("%s is not a URL", envURL)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// newSchema creates a schema of its own for one test on the server at rawURL, migrates it, and
// drops its tables and itself in Cleanup. It returns a driver on it for the test's own use.
func newSchema(tb testing.TB, rawURL string) (admin *Driver, schemaURL string) {
	tb.Helper()
	schema := "fenced_t_" + rand.Text()[:12]
	schemaURL = withSchema(tb, rawURL, schema)
	admin, err := Open(schemaURL)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := admin.Migrate(ctx); err != nil {
		_ = admin.Close()
		tb.Fatalf("migrate %s: %v", schema, err)
	}
	tb.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		q := quoteName(schema)
		for _, stmt := range []string{
			"DROP TABLE IF EXISTS " + q + ".[fenced_resources]",
			"DROP TABLE IF EXISTS " + q + ".[fenced_schema_migrations]",
			"DROP SCHEMA IF EXISTS " + q,
		} {
			if _, err := admin.DB().ExecContext(ctx, stmt); err != nil {
				tb.Errorf("drop test schema %s: %v", schema, err)
			}
		}
	})
	return admin, schemaURL
}

// newTarget gives each test its own schema; every Open is a new connection pool on it.
func newTarget(t *testing.T) drivertest.Target {
	admin, schemaURL := newSchema(t, serverURL(t))
	expire := fmt.Sprintf(`UPDATE %s.[fenced_resources]
SET lease_until = DATEADD(second, -1, SYSUTCDATETIME())
WHERE resource = @resource AND lease_until IS NOT NULL`, quoteName(admin.Schema()))
	return drivertest.Target{
		Open: func(t *testing.T) driver.Driver {
			d, err := Open(schemaURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			return d
		},
		Expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, expire, sql.Named("resource", resource))
			return err
		},
	}
}

func TestConformance(t *testing.T) {
	serverURL(t) // skip once, loudly, rather than in each of the suite's subtests
	drivertest.Run(t, newTarget)
}
