package gate

import (
	"context"
	"errors"
	"strings"
)

// Unconditional replaces the check with the statement a naive gate would run: raise the mark
// without comparing it. The mutation test shows the suite's schedules catch it.
func Unconditional(g *Gate) {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	g.forget()
	switch g.d {
	case MySQL:
		g.q.check = `UPDATE ` + DefaultTable + ` SET epoch = ?, generation = ? WHERE resource = ? AND LAST_INSERT_ID(? IS NOT NULL OR ? IS NOT NULL OR ? IS NOT NULL)`
	case Postgres:
		g.q.raise = `UPDATE ` + DefaultTable + ` SET epoch = $2, generation = $3 WHERE resource = $1 RETURNING 1`
		g.q.check = `WITH fenced_raise AS (` + g.q.raise + `) ` + g.q.answer
	default:
		g.q.check = `UPDATE ` + DefaultTable + ` SET epoch = $2, generation = $3 WHERE resource = $1`
	}
}

// ShareLock replaces the lock that PostgreSQL's check takes on the row of a mark equal to the
// token with lock, for the mutants "FOR KEY SHARE" (which a raise does not wait for) and ""
// (no lock at all).
func ShareLock(g *Gate, lock string) {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	g.forget()
	g.q.answer = strings.Replace(g.q.answer, "FOR SHARE", lock, 1)
	g.q.check = `WITH fenced_raise AS (` + g.q.raise + `) ` + g.q.answer
}

// ReadOnlyEqual makes SQLite's check a plain read, the mutant of an equal-token check that
// does not take the database's write lock.
func ReadOnlyEqual(g *Gate) {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	g.forget()
	g.q.check = `SELECT EXISTS (SELECT 1 FROM ` + DefaultTable + ` WHERE resource = ?1 AND epoch = ?2 AND generation = ?3)`
	g.q.answers = true
}

// Legacy gives g the check of the earlier version, which writes a new version of the mark's
// row even when the token equals the mark, for the benchmark that runs the two in alternation
// (PostgreSQL, SQLite; MySQL's check is unchanged). On SQLite it adds the counter column that
// the earlier check incremented.
func Legacy(ctx context.Context, g *Gate) error {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	g.forget()
	switch g.d {
	case Postgres: // any UPDATE writes a new row version
		g.q.raise = `UPDATE ` + DefaultTable + ` SET epoch = $2, generation = $3 WHERE resource = $1 AND (epoch < $2 OR (epoch = $2 AND generation <= $3)) RETURNING 1`
		g.q.check = `WITH fenced_raise AS (` + g.q.raise + `) ` + g.q.answer
	case SQLite:
		if _, err := g.db.ExecContext(ctx, `ALTER TABLE `+DefaultTable+` ADD COLUMN checks INTEGER NOT NULL DEFAULT 0`); err != nil {
			return err
		}
		g.q.check = `UPDATE ` + DefaultTable + ` SET epoch = ?2, generation = ?3, checks = checks + 1 WHERE resource = ?1 AND (epoch < ?2 OR (epoch = ?2 AND generation <= ?3))`
	default:
		return errors.New("no earlier check for " + g.d.String())
	}
	return nil
}

// forget drops what g built from its statements (the prepared check, Exec's statements), so
// that a mutation takes effect. g.stmtMu is held.
func (g *Gate) forget() {
	if g.stmt != nil {
		_ = g.stmt.Close()
		g.stmt = nil
	}
	g.execs.Clear()
	g.nExecs.Store(0)
	g.batchable.Store(batchUnknown)
}

// ExecQuery is Exec's statement on PostgreSQL for write with n arguments, and the number of
// statements cached.
func ExecQuery(g *Gate, write string, n int) (string, int) {
	return g.execQuery(write, n), int(g.nExecs.Load())
}

const MaxExecs = maxExecs
