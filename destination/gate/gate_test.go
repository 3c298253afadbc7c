package gate_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
	"github.com/fenced-dev/fenced/driver/drivertest"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

func openSQLite(t testing.TB) *sql.DB {
	path := filepath.Join(t.TempDir(), "service.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

const defaultPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func pgPing(u string) error {
	db, err := sql.Open("pgx", u)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// openPostgres returns a database whose connections use a fresh schema, dropped at the end.
func openPostgres(t testing.TB) *sql.DB {
	base := drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", defaultPostgres, pgPing)
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	schema := "gate_" + strings.ToLower(rand.Text()[:16])
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.Close()
		if _, err := admin.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		_ = admin.Close()
	})
	return db
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, gatetest.Engine{Dialect: gate.SQLite, Open: openSQLite})
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres})
}

func TestNewRefusesBadConfig(t *testing.T) {
	db := openSQLite(t)
	for _, table := range []string{"x; DROP TABLE y", "1abc", "a b", "ü"} {
		if _, err := gate.New(db, gate.SQLite, &gate.Config{Table: table}); err == nil {
			t.Errorf("table %q accepted", table)
		}
	}
	if _, err := gate.New(db, gate.Dialect(9), nil); err == nil {
		t.Error("unknown dialect accepted")
	}
	if _, err := gate.New(nil, gate.SQLite, nil); err == nil {
		t.Error("nil db accepted")
	}
}

// TestPostgresCheckWaitsForTheRaise: a check waiting on an uncommitted raise's row lock is
// decided on the committed mark.
func TestPostgresCheckWaitsForTheRaise(t *testing.T) {
	gatetest.CheckWaitsForTheRaise(t, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}, 10*time.Millisecond,
		func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool {
			var pid int
			if err := tx2.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			return func() bool {
				var waiting bool
				err := db.QueryRowContext(ctx, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
				return err == nil && waiting
			}
		})
}

// BenchmarkGate: a service's write transaction with the gate's check beside the same
// transaction without it. Run with: go test -run '^$' -bench Gate -count 6 ./destination/gate/
func BenchmarkGate(b *testing.B) {
	b.Run("db=sqlite", func(b *testing.B) { gatetest.Bench(b, gatetest.Engine{Dialect: gate.SQLite, Open: openSQLite}) })
	b.Run("db=postgres", func(b *testing.B) { gatetest.Bench(b, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}) })
}
