package gate_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
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
func openPostgres(t testing.TB) *sql.DB { return openPostgresWith(t, nil) }

// openPostgresWith is openPostgres whose connections are wrapped by wrap, if not nil.
func openPostgresWith(t testing.TB, wrap func(net.Conn) net.Conn) *sql.DB {
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
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		dial := cfg.DialFunc
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(c), nil
		}
	}
	db := stdlib.OpenDB(*cfg)
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
	for name, c := range map[string]struct {
		d   gate.Dialect
		cfg gate.Config
	}{
		"MySQLMultiStatements on SQLite":  {gate.SQLite, gate.Config{MySQLMultiStatements: true}},
		"MySQLNoBatchDetection on SQLite": {gate.SQLite, gate.Config{MySQLNoBatchDetection: true}},
		"both MySQL options":              {gate.MySQL, gate.Config{MySQLMultiStatements: true, MySQLNoBatchDetection: true}},
	} {
		if _, err := gate.New(db, c.d, &c.cfg); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// TestPostgresCheckWaitsForTheRaise: a check waiting on an uncommitted raise's row lock is
// decided on the committed mark. The mutants accept the superseded holder's token 1.5, equal
// to the committed mark, while the raise to 1.6 is open: without the share lock, with FOR KEY
// SHARE (which does not wait for a raise), and the check that accepts a token equal to what a
// plain read of the mark saw; the last one passes the schedules that start from 0.0.
func TestPostgresCheckWaitsForTheRaise(t *testing.T) {
	e := gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}
	gatetest.CheckWaitsForTheRaise(t, e, 10*time.Millisecond, pgWaiting(t))
	for _, m := range []struct {
		name   string
		mutate func(s *gatetest.Service) gatetest.Checker
	}{
		{"FOR KEY SHARE", func(s *gatetest.Service) gatetest.Checker { return shareLocked(t, s, "FOR KEY SHARE") }},
		{"no share lock", func(s *gatetest.Service) gatetest.Checker { return shareLocked(t, s, "") }},
		{"plain read", func(s *gatetest.Service) gatetest.Checker { return pgPlainReadCheck{s.Gate} }},
	} {
		t.Run("mutant "+m.name, func(t *testing.T) {
			s := gatetest.NewService(t, e)
			s.Checker = m.mutate(s)
			err := gatetest.CheckWaitsForTheRaiseOf(context.Background(), s, gatetest.Tok(1, 5), gatetest.Tok(1, 5), destination.ErrStale, 10*time.Millisecond, pgWaiting(t))
			if err == nil || !strings.Contains(err.Error(), "finished while tx1 held the row raised to "+gatetest.Tok(1, 6).String()+": <nil>") {
				t.Fatalf("the mutant %q passed: %v", m.name, err)
			}
		})
	}
}

// shareLocked is a second gate on s's table whose check takes lock in place of FOR SHARE.
func shareLocked(t *testing.T, s *gatetest.Service, lock string) *gate.Gate {
	g, err := gate.New(s.DB, gate.Postgres, nil)
	if err != nil {
		t.Fatal(err)
	}
	gate.ShareLock(g, lock)
	return g
}

// pgPlainReadCheck is the mutant that accepts a token equal to the mark as a plain SELECT
// (the statement's snapshot, no lock) saw it; other tokens go to the gate.
type pgPlainReadCheck struct{ *gate.Gate }

func (c pgPlainReadCheck) Check(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token) error {
	var equal bool
	err := tx.QueryRowContext(ctx, "SELECT epoch = $2 AND generation = $3 FROM "+gate.DefaultTable+" WHERE resource = $1",
		resource, t.Epoch, t.Generation).Scan(&equal)
	if err == nil && equal {
		return nil
	}
	return c.Gate.Check(ctx, tx, resource, t)
}

// BenchmarkGate: a service's write transaction with the gate's check beside the same
// transaction without it. Run with: go test -run '^$' -bench Gate -count 6 ./destination/gate/
func BenchmarkGate(b *testing.B) {
	b.Run("db=sqlite", func(b *testing.B) { gatetest.Bench(b, gatetest.Engine{Dialect: gate.SQLite, Open: openSQLite}) })
	b.Run("db=postgres", func(b *testing.B) { gatetest.Bench(b, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}) })
}

// pgWaiting reports whether tx2's session waits on a lock.
func pgWaiting(t *testing.T) func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool {
	return func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool {
		var pid int
		if err := tx2.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return func() bool {
			var waiting bool
			err := db.QueryRowContext(ctx, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
			return err == nil && waiting
		}
	}
}

// TestPostgresRaiseWaitsForTheCheck: a check of the mark's own token takes a share lock that a
// raise waits for, and that a second check of the same token does not. The mutants without the
// share lock, or with FOR KEY SHARE (which a raise does not wait for), let the raise commit
// while the first check's transaction is open.
func TestPostgresRaiseWaitsForTheCheck(t *testing.T) {
	e := gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}
	ctx := context.Background()
	if err := gatetest.RaiseWaitsForTheCheck(ctx, gatetest.NewService(t, e), true, 10*time.Millisecond, pgWaiting(t)); err != nil {
		t.Fatal(err)
	}
	for _, lock := range []string{"FOR KEY SHARE", ""} {
		t.Run("mutant "+lock, func(t *testing.T) {
			s := gatetest.NewService(t, e)
			gate.ShareLock(s.Gate, lock)
			err := gatetest.RaiseWaitsForTheCheck(ctx, s, true, 10*time.Millisecond, pgWaiting(t))
			if err == nil || !strings.Contains(err.Error(), "while tx1") {
				t.Fatalf("the mutant %q passed: %v", lock, err)
			}
		})
	}
}

// openSQLiteAt opens the database at path with the given busy timeout in milliseconds.
func openSQLiteAt(t testing.TB, path string, busyMillis int) *sql.DB {
	db, err := sql.Open("sqlite", fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)", path, busyMillis))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestSQLiteCheckHoldsTheWriteLock: on SQLite, a check of the mark's own token writes nothing
// but takes the database's write lock, so a raise from another connection cannot commit while
// the checking transaction is open (with no busy timeout it is refused at once). The mutant
// whose check is a plain read lets the raise commit.
func TestSQLiteCheckHoldsTheWriteLock(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(*gate.Gate)
	}{{"check", nil}, {"mutant read-only", gate.ReadOnlyEqual}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "service ü.db")
			s := gatetest.NewService(t, gatetest.Engine{Dialect: gate.SQLite, Open: func(t testing.TB) *sql.DB { return openSQLiteAt(t, path, 10000) }})
			other, err := gate.New(openSQLiteAt(t, path, 0), gate.SQLite, nil)
			if err != nil {
				t.Fatal(err)
			}
			const r = "rapport nº 8"
			b, next := gatetest.Tok(1, 6), gatetest.Tok(2, 1)
			if err := s.Gate.Add(ctx, r); err != nil {
				t.Fatal(err)
			}
			if err := s.Gate.Fence(ctx, r, b); err != nil {
				t.Fatal(err)
			}
			if c.mutate != nil {
				c.mutate(s.Gate)
			}
			tx1, err := s.DB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx1.Rollback() }()
			if err := s.Gate.Check(ctx, tx1, r, b); err != nil {
				t.Fatal(err)
			}
			err = other.Fence(ctx, r, next)
			if c.mutate != nil {
				if err == nil {
					return // the mutant is caught: the raise committed while tx1 was open
				}
				t.Fatalf("the mutant's raise was refused: %v", err)
			}
			if err == nil || !strings.Contains(err.Error(), "locked") {
				t.Fatalf("a raise while a check's transaction is open: %v, want database is locked", err)
			}
			if err := s.WriteTx(ctx, tx1, r, []byte("under b \x00")); err != nil {
				t.Fatal(err)
			}
			if err := tx1.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := other.Fence(ctx, r, next); err != nil {
				t.Fatalf("the raise after tx1 committed: %v", err)
			}
		})
	}
}

// TestEqualCheckWritesNothing: a committed check of the mark's own token leaves the mark's row
// as it was: no new row version on PostgreSQL (its ctid and xmin unchanged), no WAL frame on
// SQLite. The earlier check (gate.Legacy), run the same way, is shown to write.
func TestEqualCheckWritesNothing(t *testing.T) {
	ctx := context.Background()
	const r = "rapport nº 9"
	tk := gatetest.Tok(1, 4)
	for _, c := range []struct {
		engine gatetest.Engine
		// written returns a reading of what the database has written, to compare
		written func(s *gatetest.Service, path string) string
	}{
		{gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}, func(s *gatetest.Service, _ string) string {
			var v string
			if err := s.DB.QueryRowContext(ctx, "SELECT ctid::text || ' ' || xmin::text FROM "+gate.DefaultTable+" WHERE resource = $1", r).Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}},
		{gatetest.Engine{Dialect: gate.SQLite}, func(_ *gatetest.Service, path string) string {
			fi, err := os.Stat(path + "-wal")
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprint(fi.Size(), " bytes of WAL")
		}},
	} {
		for _, legacy := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/legacy=%v", c.engine.Dialect, legacy), func(t *testing.T) {
				e := c.engine
				path := filepath.Join(t.TempDir(), "service.db")
				if e.Dialect == gate.SQLite {
					e.Open = func(t testing.TB) *sql.DB { return openSQLiteAt(t, path, 10000) }
				}
				s := gatetest.NewService(t, e)
				if err := s.Gate.Add(ctx, r); err != nil {
					t.Fatal(err)
				}
				if legacy {
					if err := gate.Legacy(ctx, s.Gate); err != nil {
						t.Fatal(err)
					}
				}
				if err := s.Gate.Fence(ctx, r, tk); err != nil {
					t.Fatal(err)
				}
				before := c.written(s, path)
				for range 20 {
					if err := s.Gate.Do(ctx, r, tk, func(*sql.Tx) error { return nil }); err != nil {
						t.Fatal(err)
					}
				}
				after := c.written(s, path)
				if changed := before != after; changed != legacy {
					t.Fatalf("before %q, after 20 equal checks %q", before, after)
				}
			})
		}
	}
}

// BenchmarkGateEarlier: the service's transaction with the current check and with the earlier
// one (which wrote the mark's row on an equal token) in the same rounds, beside the raw
// transaction. Run with: go test -run '^$' -bench 'GateEarlier/.*/earlier' -benchtime 2s -count 3 ./destination/gate/
func BenchmarkGateEarlier(b *testing.B) {
	for _, d := range []gate.Dialect{gate.SQLite, gate.Postgres} {
		open := map[gate.Dialect]func(testing.TB) *sql.DB{gate.SQLite: openSQLite, gate.Postgres: openPostgres}[d]
		b.Run("db="+d.String(), func(b *testing.B) {
			gatetest.BenchAgainst(b, gatetest.Engine{Dialect: d, Open: open}, func(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
				g, err := gate.New(s.DB, d, nil) // the same table, the earlier statement
				if err != nil {
					return nil, err
				}
				return g, gate.Legacy(ctx, g)
			})
		})
	}
}

// TestExecQueryCache: Exec's statement on PostgreSQL is built once per write text and number
// of arguments, with the check's parameters after the write's, and the cache stops growing at
// its bound when the write's text keeps changing.
func TestExecQueryCache(t *testing.T) {
	db, err := sql.Open("pgx", defaultPostgres) // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g, err := gate.New(db, gate.Postgres, nil)
	if err != nil {
		t.Fatal(err)
	}
	const w = `UPDATE gate_data SET data = $2 WHERE resource = $1`
	q, n := gate.ExecQuery(g, w, 2)
	if !strings.HasPrefix(q, "WITH fenced_write AS ("+w+"), fenced_raise AS (") || !strings.Contains(q, "WHERE resource = $3 AND (epoch < $4 OR (epoch = $4 AND generation < $5))") || n != 1 {
		t.Fatalf("%d cached; the statement for 2 arguments:\n%s", n, q)
	}
	if again, _ := gate.ExecQuery(g, w, 2); again != q {
		t.Fatalf("built again differently:\n%s", again)
	}
	if q3, _ := gate.ExecQuery(g, w, 3); !strings.Contains(q3, "resource = $4") {
		t.Fatalf("the statement for 3 arguments:\n%s", q3)
	}
	for i := range 2 * gate.MaxExecs {
		if _, n = gate.ExecQuery(g, fmt.Sprintf("DELETE FROM gate_data WHERE resource = 'r %d'", i), 0); n > gate.MaxExecs {
			t.Fatalf("%d statements cached, more than %d", n, gate.MaxExecs)
		}
	}
	if n != gate.MaxExecs {
		t.Fatalf("%d statements cached, want %d", n, gate.MaxExecs)
	}
}

// commitDropper passes a connection's traffic through until armed; armed, it sends the next
// write that carries a COMMIT and then closes the connection, so that the database commits
// and its reply is lost.
type commitDropper struct{ armed atomic.Bool }

func (d *commitDropper) wrap(c net.Conn) net.Conn { return &droppingConn{Conn: c, d: d} }

type droppingConn struct {
	net.Conn
	d *commitDropper
}

func (c *droppingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && bytes.Contains(bytes.ToLower(p), []byte("commit")) && c.d.armed.CompareAndSwap(true, false) {
		_ = c.Close()
	}
	return n, err
}

// TestCommitReplyLost: when COMMIT's reply is lost the write may have committed, so Do reports
// the outcome as unknown (fenced.ErrOutcomeUnknown) and Handler answers the outcome-unknown
// problem, not "rolled back".
func TestCommitReplyLost(t *testing.T) {
	ctx := context.Background()
	var drop commitDropper
	db := openPostgresWith(t, drop.wrap)
	s := gatetest.NewService(t, gatetest.Engine{Dialect: gate.Postgres, Open: func(testing.TB) *sql.DB { return db }})
	const r = "rapport nº 10"
	if err := s.Gate.Add(ctx, r); err != nil {
		t.Fatal(err)
	}
	err := s.Gate.Do(ctx, r, gatetest.Tok(1, 1), func(tx *sql.Tx) error {
		drop.armed.Store(true)
		return s.WriteTx(ctx, tx, r, []byte("maybe"))
	})
	var unknown *fenced.OutcomeUnknownError
	if !errors.Is(err, fenced.ErrOutcomeUnknown) || !errors.As(err, &unknown) || unknown.Resource != r {
		t.Fatalf("Do with COMMIT's reply lost: %v, want outcome unknown for %q", err, r)
	}

	srv := httptest.NewServer(s.Gate.Handler(func(w http.ResponseWriter, req *http.Request, tx *sql.Tx) error {
		drop.armed.Store(true)
		w.WriteHeader(http.StatusCreated)
		return s.WriteTx(req.Context(), tx, r, []byte("maybe too"))
	}))
	defer srv.Close()
	req, _ := http.NewRequest("PUT", srv.URL, nil)
	req.Header.Set(destination.Header, destination.FormatHeader(r, gatetest.Tok(1, 2)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p gate.Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError || p.Type != gate.ProblemOutcomeUnknown ||
		!strings.Contains(p.Detail, "may or may not have committed") || strings.Contains(p.Detail, "rolled back") {
		t.Fatalf("answer %s %+v, want the outcome-unknown problem", resp.Status, p)
	}
}
