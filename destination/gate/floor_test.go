package gate_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
)

// pgFloor is what the gate's check is measured against on PostgreSQL: a statement that locks
// one row of another table FOR SHARE, found by its primary key, with no condition on it and
// no raise beside it. It decides nothing (it accepts whenever the row exists); it is the cost
// of touching a second row in the service's transaction.
type pgFloor struct{}

const pgFloorLock = `SELECT EXISTS (SELECT FROM fenced_floor WHERE resource = $%d FOR SHARE)`

func newPGFloor(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
	for _, q := range []string{
		`CREATE TABLE fenced_floor (resource text PRIMARY KEY, epoch bigint NOT NULL, generation bigint NOT NULL)`,
		`INSERT INTO fenced_floor SELECT resource, epoch, generation FROM ` + gate.DefaultTable,
	} {
		if _, err := s.DB.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	return pgFloor{}, nil
}

func (pgFloor) Check(ctx context.Context, tx *sql.Tx, resource string, _ fenced.Token) error {
	return pgFloorAnswer(tx.QueryRowContext(ctx, fmt.Sprintf(pgFloorLock, 1), resource))
}

func (pgFloor) Exec(ctx context.Context, tx *sql.Tx, resource string, _ fenced.Token, write string, args ...any) error {
	q := `WITH fenced_write AS (` + write + `) ` + fmt.Sprintf(pgFloorLock, len(args)+1)
	return pgFloorAnswer(tx.QueryRowContext(ctx, q, append(args, resource)...))
}

func pgFloorAnswer(row *sql.Row) error {
	var ok bool
	if err := row.Scan(&ok); err != nil || !ok {
		return fmt.Errorf("floor: row not found (%v)", err)
	}
	return nil
}

// BenchmarkGateFloor: on PostgreSQL, the gate's transactions beside the same transactions with
// pgFloor in place of the check, in the same rounds. Run with:
// go test -run '^$' -bench GateFloor -benchtime 2s -count 3 ./destination/gate/
func BenchmarkGateFloor(b *testing.B) {
	gatetest.BenchFloor(b, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}, newPGFloor)
}

// TestPostgresCounts logs, per transaction, the round trips and bytes the client sends and the
// WAL PostgreSQL inserts (a server-wide counter: other sessions' writes add to it), for the
// raw transaction, the gate's Check and Exec, and pgFloor's, over 50 transactions each (500
// with FENCED_GATE_COUNTS=1; -v shows them). It fails if Exec sends more requests than the raw
// transaction: its check must cost no round trip of its own.
func TestPostgresCounts(t *testing.T) {
	n := 50
	if os.Getenv("FENCED_GATE_COUNTS") != "" {
		n = 500
	}
	var wire gatetest.Wire
	db := openPostgresWith(t, wire.Conn)
	db.SetMaxOpenConns(1)
	s := gatetest.NewService(t, gatetest.Engine{Dialect: gate.Postgres, Open: func(testing.TB) *sql.DB { return db }})
	status := func(ctx context.Context) (map[string]int64, error) {
		var wal int64
		err := db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&wal)
		return map[string]int64{"wal_bytes(server-wide)": wal}, err
	}
	var pid int
	if err := db.QueryRow(`SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	backendCPU := func() time.Duration { // the connection's backend process, when the server runs on this host
		cpu, _ := gatetest.ThreadCPU(pid, pid)
		return cpu
	}
	rows := gatetest.Counts(t, s, &wire, n, status, backendCPU, map[string]func(context.Context, *gatetest.Service) (gatetest.Checker, error){
		"floor": newPGFloor, "function": newPGFunction, "sharefirst": newPGShareFirst,
	})
	for _, r := range rows {
		t.Log(r)
	}
	plans, err := db.Query(`SELECT generic_plans, custom_plans, left(regexp_replace(statement, '\s+', ' ', 'g'), 90) FROM pg_prepared_statements ORDER BY 3`)
	if err != nil {
		t.Fatal(err)
	}
	for plans.Next() {
		var g, c int64
		var q string
		if err := plans.Scan(&g, &c, &q); err != nil {
			t.Fatal(err)
		}
		t.Logf("plans: generic %d, custom %d: %s", g, c, q)
	}
	_ = plans.Close()
	if rows[0].Name != "raw" || rows[2].Name != "exec" || rows[2].RoundTrips > rows[0].RoundTrips+0.01 {
		t.Errorf("exec %.2f round trips, raw %.2f", rows[2].RoundTrips, rows[0].RoundTrips)
	}
}

// pgRaiseOrLock ends the candidates' PL/pgSQL functions as the gate's statement does: raise
// the mark where the token is newer, else lock it FOR SHARE where it is not newer.
const pgRaiseOrLock = `
			UPDATE ` + gate.DefaultTable + ` SET epoch = e, generation = g WHERE resource = r AND (epoch < e OR (epoch = e AND generation < g));
			IF FOUND THEN
				RETURN true;
			END IF;
			RETURN EXISTS (SELECT FROM ` + gate.DefaultTable + ` WHERE resource = r AND (epoch < e OR (epoch = e AND generation <= g)) FOR SHARE);
		END $$`

// pgFunction is a candidate check on PostgreSQL, measured beside the gate's: a PL/pgSQL
// function that first locks the mark FOR SHARE where it equals the token (a holder's every
// write after its first: one locking read, no UPDATE node), and otherwise runs the gate's
// raise and then its share lock where the mark is not newer. Not used by the gate.
type pgFunction struct{}

func newPGFunction(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
	_, err := s.DB.ExecContext(ctx, `CREATE FUNCTION fenced_gate_check(r text, e bigint, g bigint) RETURNS boolean
		LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM FROM `+gate.DefaultTable+` WHERE resource = r AND epoch = e AND generation = g FOR SHARE;
			IF FOUND THEN
				RETURN true;
			END IF;
`+pgRaiseOrLock)
	return pgFunction{}, err
}

func (pgFunction) Check(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token) error {
	return pgFloorAnswer(tx.QueryRowContext(ctx, `SELECT fenced_gate_check($1, $2, $3)`, resource, t.Epoch, t.Generation))
}

func (pgFunction) Exec(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token, write string, args ...any) error {
	n := len(args)
	q := fmt.Sprintf(`WITH fenced_write AS (%s) SELECT fenced_gate_check($%d, $%d, $%d)`, write, n+1, n+2, n+3)
	return pgFloorAnswer(tx.QueryRowContext(ctx, q, append(args, resource, t.Epoch, t.Generation)...))
}

// BenchmarkGateFunction: the gate's check beside pgFunction's, in the same rounds. Run with:
// go test -run '^$' -bench GateFunction -benchtime 2s -count 3 ./destination/gate/
func BenchmarkGateFunction(b *testing.B) {
	gatetest.BenchBeside(b, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}, "function", newPGFunction)
}

// pgShareFirst is another candidate: the statement locks the mark FOR SHARE where it equals
// the token, in SQL, and only otherwise calls a PL/pgSQL function that raises it (or locks a
// mark that is not newer), so that a holder's writes after its first run no UPDATE node at all.
// Not used by the gate. Loaded, its server CPU per transaction was the floor's and 10-25 µs
// below the gate's (docs/benchmarks/session8-gate-*); elapsed times could not tell them apart.
type pgShareFirst struct{}

func newPGShareFirst(ctx context.Context, s *gatetest.Service) (gatetest.Checker, error) {
	_, err := s.DB.ExecContext(ctx, `CREATE FUNCTION fenced_gate_raise(r text, e bigint, g bigint) RETURNS boolean
		LANGUAGE plpgsql AS $$
		BEGIN
`+pgRaiseOrLock)
	return pgShareFirst{}, err
}

func shareFirst(n int) string {
	return fmt.Sprintf(`SELECT CASE WHEN EXISTS (SELECT FROM `+gate.DefaultTable+` WHERE resource = $%[1]d AND epoch = $%[2]d AND generation = $%[3]d FOR SHARE)
		THEN true ELSE fenced_gate_raise($%[1]d, $%[2]d, $%[3]d) END`, n+1, n+2, n+3)
}

func (pgShareFirst) Check(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token) error {
	return pgFloorAnswer(tx.QueryRowContext(ctx, shareFirst(0), resource, t.Epoch, t.Generation))
}

func (pgShareFirst) Exec(ctx context.Context, tx *sql.Tx, resource string, t fenced.Token, write string, args ...any) error {
	q := `WITH fenced_write AS (` + write + `) ` + shareFirst(len(args))
	return pgFloorAnswer(tx.QueryRowContext(ctx, q, append(args, resource, t.Epoch, t.Generation)...))
}

// BenchmarkGateShareFirst: the gate's check beside pgShareFirst's, in the same rounds. Run with:
// go test -run '^$' -bench GateShareFirst -benchtime 2s -count 3 ./destination/gate/
func BenchmarkGateShareFirst(b *testing.B) {
	gatetest.BenchBeside(b, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres}, "sharefirst", newPGShareFirst)
}
