package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
	"github.com/go-sql-driver/mysql"
)

// openWire opens a test database (with the DSN parameters in query, if any) whose
// connections count what they send on wire.
func openWire(t testing.TB, query string, wire *gatetest.Wire) *sql.DB {
	u := CreateTestDatabase(t)
	if query != "" {
		u += "?" + query
	}
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wire.Conn(c), nil
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// floorCheck is what the gate's check is measured against on MariaDB/MySQL: a statement on one
// row of another table, found by its primary key, with no condition on the token: an UPDATE
// that sets a column to itself (InnoDB locks the row and writes nothing, as the gate's check of
// an equal token), or a locking read. It decides nothing; it is the cost of touching a second
// row in the service's transaction, in a round trip of its own (Check, and Exec one at a time)
// or batched after the write (Exec with batch).
type floorCheck struct {
	stmt  *sql.Stmt
	query string
	batch bool
}

const (
	floorUpdate = `UPDATE fenced_floor SET epoch = epoch WHERE resource = ?`
	floorSelect = `SELECT epoch FROM fenced_floor WHERE resource = ? FOR UPDATE`
)

func newFloorCheck(query string, batch bool) func(context.Context, *gatetest.Service) (gatetest.Checker, error) {
	return func(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
		for _, q := range []string{
			`CREATE TABLE IF NOT EXISTS fenced_floor (resource VARBINARY(255) NOT NULL PRIMARY KEY,
				epoch BIGINT NOT NULL, generation BIGINT NOT NULL) ENGINE=InnoDB`,
			`INSERT IGNORE INTO fenced_floor (resource, epoch, generation) SELECT resource, epoch, generation FROM ` + gate.DefaultTable,
		} {
			if _, err := s.DB.ExecContext(ctx, q); err != nil {
				return nil, err
			}
		}
		stmt, err := s.DB.PrepareContext(ctx, query)
		return floorCheck{stmt: stmt, query: query, batch: batch}, err
	}
}

func (c floorCheck) Check(ctx context.Context, tx *sql.Tx, resource string, _ fenced.Token) error {
	s := tx.StmtContext(ctx, c.stmt)
	defer func() { _ = s.Close() }()
	if strings.HasPrefix(c.query, "SELECT") {
		var e int64
		return s.QueryRowContext(ctx, resource).Scan(&e)
	}
	_, err := s.ExecContext(ctx, resource)
	return err
}

func (c floorCheck) Exec(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token, write string, args ...any) error {
	if !c.batch {
		return checkThenWrite(ctx, c, tx, resource, t, write, args)
	}
	_, err := tx.ExecContext(ctx, write+"; "+c.query, append(args, resource)...)
	return err
}

// checkThenWrite is a benchmark's Exec one statement at a time: c's check, then write.
func checkThenWrite(ctx context.Context, c gatetest.Checker, tx *sql.Tx, resource string, t fenced.Token, write string, args []any) error {
	if err := c.Check(ctx, tx, resource, t); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, write, args...)
	return err
}

// markedService is a service of e whose resource res has the mark m.
func markedService(t *testing.T, e gatetest.Engine, res string, m fenced.Token) *gatetest.Service {
	t.Helper()
	ctx := context.Background()
	s := gatetest.NewService(t, e)
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	if err := s.Gate.Fence(ctx, res, m); err != nil {
		t.Fatal(err)
	}
	return s
}

// connectionThread returns the server's process and the thread that serves db's one
// connection, when the server runs on this host with one thread per connection: the thread
// whose CPU time grows most while the connection computes.
func connectionThread(t testing.TB, db *sql.DB) (pid, tid int, ok bool) {
	var name, file string
	if err := db.QueryRow(`SHOW VARIABLES LIKE 'pid_file'`).Scan(&name, &file); err != nil {
		return 0, 0, false
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, 0, false
	}
	if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return 0, 0, false
	}
	before, err := gatetest.Threads(pid)
	if err != nil {
		return 0, 0, false
	}
	if _, err := db.Exec(`DO BENCHMARK(3000000, MD5('fenced'))`); err != nil {
		t.Fatal(err)
	}
	after, _ := gatetest.Threads(pid)
	var most time.Duration
	for k, v := range after {
		if d := v - before[k]; d > most {
			most, tid = d, k
		}
	}
	return pid, tid, tid != 0
}

// threadCPU reads the CPU time of the server's thread for db's one connection, or nil when
// connectionThread does not find it.
func threadCPU(t testing.TB, db *sql.DB) func() time.Duration {
	pid, tid, ok := connectionThread(t, db)
	if !ok {
		return nil
	}
	return func() time.Duration {
		cpu, _ := gatetest.ThreadCPU(pid, tid)
		return cpu
	}
}

// mariaStatus reads the session's statement and handler counters and InnoDB's server-wide
// redo log position and row counters (other sessions' writes add to those).
func mariaStatus(db *sql.DB) func(context.Context) (map[string]int64, error) {
	return func(ctx context.Context) (map[string]int64, error) {
		m := map[string]int64{}
		for _, q := range []string{
			`SHOW SESSION STATUS WHERE Variable_name IN ('Questions', 'Com_select', 'Com_update', 'Com_insert',
				'Com_stmt_execute', 'Com_stmt_prepare', 'Com_begin', 'Com_commit', 'Handler_read_key',
				'Handler_update', 'Handler_write', 'Handler_commit', 'Handler_prepare')`,
			`SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_lsn_current', 'Innodb_rows_updated', 'Innodb_os_log_written')`,
		} {
			rows, err := db.QueryContext(ctx, q)
			if err != nil {
				return nil, err
			}
			for rows.Next() {
				var k string
				var v int64
				if err := rows.Scan(&k, &v); err != nil {
					_ = rows.Close()
					return nil, err
				}
				if strings.HasPrefix(k, "Innodb") {
					k += "(server-wide)"
				}
				m[k] = v
			}
			if err := rows.Close(); err != nil {
				return nil, err
			}
		}
		return m, nil
	}
}

// TestGateCounts logs, per transaction, the round trips and bytes the client sends, the
// session's statement and handler counters and InnoDB's redo bytes, for the raw transaction,
// the gate's Check and Exec and the floors', one statement at a time and batched. Run with
// FENCED_GATE_COUNTS=1 and -v.
func TestGateCounts(t *testing.T) {
	if os.Getenv("FENCED_GATE_COUNTS") == "" {
		t.Skip("set FENCED_GATE_COUNTS=1 to count")
	}
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batched=", batch), func(t *testing.T) {
			var wire gatetest.Wire
			query, cfg := "", (*gate.Config)(nil)
			if batch {
				query, cfg = "multiStatements=true", &gate.Config{MySQLMultiStatements: true}
			}
			db := openWire(t, query, &wire)
			db.SetMaxOpenConns(1)
			s := gatetest.NewService(t, gatetest.Engine{Dialect: gate.MySQL, Config: cfg, Open: func(testing.TB) *sql.DB { return db }})
			rows := gatetest.Counts(t, s, &wire, 500, mariaStatus(db), threadCPU(t, db), map[string]func(context.Context, *gatetest.Service) (gatetest.Checker, error){
				"floor-update": newFloorCheck(floorUpdate, batch),
				"floor-select": newFloorCheck(floorSelect, batch),
				"folded": func(_ context.Context, s *gatetest.Service) (gatetest.Checker, error) {
					return folded{s.Gate}, nil
				},
			})
			for _, r := range rows {
				t.Log(r)
			}
		})
	}
}

// BenchmarkGateFloor: the gate's transactions beside the same transactions with floorCheck's
// no-op UPDATE in place of the check, in the same rounds, one at a time and batched. Run with:
// go test -run '^$' -bench GateFloor -benchtime 2s -count 3 ./backend/mysql/
func BenchmarkGateFloor(b *testing.B) {
	b.Run("batched=false", func(b *testing.B) { gatetest.BenchFloor(b, gateEngine, newFloorCheck(floorUpdate, false)) })
	b.Run("batched=true", func(b *testing.B) { gatetest.BenchFloor(b, batchedEngine, newFloorCheck(floorUpdate, true)) })
}

// TestGateDetectsBatches: a gate without Config.MySQLMultiStatements finds out once whether its
// database's connections take a batch, and Exec then sends the write and the check in one
// round trip where they do (as many round trips a transaction as the raw one) and in two where
// they do not (one more). Either way a stale token is refused and leaves the data as it was.
// Before the detection, Exec sent one more than the raw transaction on every DSN. With
// Config.MySQLNoBatchDetection it still does, on a DSN that takes a batch too.
func TestGateDetectsBatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		query string
		cfg   *gate.Config
		more  int64 // round trips of Exec's transaction beyond the raw one's
	}{
		{"multiStatements=true", nil, 0},
		{"", nil, 1},
		{"multiStatements=true&interpolateParams=false", nil, 1}, // the write is sent as a prepared statement
		{"interpolateParams=false", nil, 1},
		{"multiStatements=true", &gate.Config{MySQLNoBatchDetection: true}, 1},
	} {
		t.Run(fmt.Sprintf("dsn=%s/nodetection=%t", c.query, c.cfg != nil), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var wire gatetest.Wire
			db := openWire(t, c.query, &wire)
			db.SetMaxOpenConns(1) // one session, whose counters say whether the gate probed
			const res = "rapport nº 12; ü"
			s := markedService(t, gatetest.Engine{Dialect: gate.MySQL, Config: c.cfg, Open: func(testing.TB) *sql.DB { return db }}, res, gatetest.Tok(1, 3))
			// The probe is the only transaction the service's setup rolls back.
			var name string
			var rollbacks int64
			if err := db.QueryRowContext(ctx, `SHOW SESSION STATUS LIKE 'Com_rollback'`).Scan(&name, &rollbacks); err != nil {
				t.Fatal(err)
			}
			if probed := rollbacks > 0; probed != (c.cfg == nil) {
				t.Errorf("%d rollbacks in the setup: probed %t, want %t", rollbacks, probed, c.cfg == nil)
			}
			raw := func() int64 {
				before := wire.Writes()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback() }()
				if err := s.WriteTx(ctx, tx, res, []byte("raw")); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				return wire.Writes() - before
			}
			raw()
			want := raw() + c.more
			for i := range 3 {
				before := wire.Writes()
				if err := s.WriteExec(ctx, res, gatetest.Tok(1, 3), []byte(fmt.Sprint("under 3 \x00", i))); err != nil {
					t.Fatal(err)
				}
				if n := wire.Writes() - before; n != want {
					t.Errorf("write %d: %d round trips, want %d", i, n, want)
				}
			}
			if err := s.WriteExec(ctx, res, gatetest.Tok(1, 2), []byte("stale")); !errors.Is(err, destination.ErrStale) {
				t.Fatalf("a stale write: %v", err)
			}
			if b, err := s.Read(ctx, res); err != nil || string(b) != "under 3 \x002" {
				t.Fatalf("data %q (%v) after a stale write", b, err)
			}
		})
	}
}

// TestGateDetected runs the destination suite and the gate's tests with a gate that found out
// by itself that its connections take a batch (no Config.MySQLMultiStatements).
func TestGateDetected(t *testing.T) {
	t.Parallel()
	e := batchedEngine
	e.Config = nil
	gatetest.Run(t, e)
}

// TestGateBatchAfterAComment: a write whose text ends in a comment is still followed by the
// check in a batch (the comment ends at the newline that joins them), and one that ends in a
// semicolon too, forced or detected: a stale token is refused, a newer one raises the mark.
// Joined by "; " alone, the check would be part of the comment.
func TestGateBatchAfterAComment(t *testing.T) {
	t.Parallel()
	detected := batchedEngine
	detected.Config = nil
	for name, e := range map[string]gatetest.Engine{"forced": batchedEngine, "detected": detected} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const res = "rapport nº 13"
			s := markedService(t, e, res, gatetest.Tok(1, 5))
			for i, comment := range []string{" -- the service's note", " # note", ";", " ; \n"} {
				write := `INSERT INTO gate_data (resource, data) VALUES (?, ?) ON DUPLICATE KEY UPDATE data = VALUES(data)` + comment
				exec := func(tok fenced.Token, data string) error {
					tx, err := s.DB.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := s.Gate.Exec(ctx, tx, res, tok, write, res, []byte(data)); err != nil {
						_ = tx.Rollback()
						return err
					}
					return tx.Commit()
				}
				newer := gatetest.Tok(1, int64(6+i))
				if err := exec(gatetest.Tok(1, 4), "stale"); !errors.Is(err, destination.ErrStale) {
					t.Errorf("%q: a stale write: %v", comment, err)
				}
				if err := exec(newer, "newer"+comment); err != nil {
					t.Fatalf("%q: a newer write: %v", comment, err)
				}
				if m, err := s.Gate.Mark(ctx, res); err != nil || m != newer {
					t.Errorf("%q: mark %s (%v), want %s", comment, m, err, newer)
				}
				if b, _ := s.Read(ctx, res); string(b) != "newer"+comment {
					t.Errorf("%q: data %q", comment, b)
				}
			}
		})
	}
}

// oneAtATime is the gate whose Exec sends the check and then the write, as Exec did on every
// DSN before the gate found out by itself that a DSN takes a batch.
type oneAtATime struct{ *gate.Gate }

func (c oneAtATime) Exec(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token, write string, args ...any) error {
	return checkThenWrite(ctx, c, tx, resource, t, write, args)
}

// BenchmarkGateDetected: on a DSN that takes a batch, Exec of a gate without
// Config.MySQLMultiStatements (found out: one batch) beside the same gate one statement at a
// time, in the same rounds (exec/one-at-a-time-exec-median). Run with:
// go test -run '^$' -bench GateDetected -benchtime 2s -count 3 ./backend/mysql/
func BenchmarkGateDetected(b *testing.B) {
	e := batchedEngine
	e.Config = nil
	gatetest.BenchBeside(b, e, "one-at-a-time", func(_ context.Context, s *gatetest.Service) (gatetest.Checker, error) {
		return oneAtATime{s.Gate}, nil
	})
}
