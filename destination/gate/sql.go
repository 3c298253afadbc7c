package gate

import (
	"fmt"

	"github.com/fenced-dev/fenced"
)

// The check is one statement evaluated by the database. It raises the mark where the presented
// token is newer (epoch first, then generation) and accepts a token equal to the mark without
// writing a new version of the row, while still locking it against a concurrent raise:
//
//   - PostgreSQL: a data-modifying WITH clause raises the mark when the token is newer; when it
//     did not, the statement locks the row FOR SHARE where the mark is not newer than the token.
//     A raise (FOR NO KEY UPDATE) waits for the share lock, and a share lock waits for an
//     uncommitted raise and is then decided on the raised row (the WHERE clause is evaluated
//     again on the newest version). FOR KEY SHARE would not conflict with the raise. The row
//     lock costs a small WAL record; the raise of the former statement cost a new row version.
//   - SQLite: the UPDATE sets the row to the values it has when the token is equal, which
//     SQLite counts as changed but does not write (the b-tree compares the record and leaves an
//     identical one alone), so an equal check dirties no page and its commit writes nothing.
//     The UPDATE takes the database's write lock all the same, as any write statement does.
//   - MySQL/MariaDB: the UPDATE sets the values the row already has when the token is equal,
//     which InnoDB leaves alone (no undo or redo record) while it keeps the row's exclusive
//     lock. MySQL then reports the row as not affected (the gate cannot require the
//     CLIENT_FOUND_ROWS flag of the caller's DSN), so the statement reports its decision in
//     the OK packet's insert id instead: the WHERE clause evaluates the comparison as
//     LAST_INSERT_ID(comparison), which sets the id to 1 or 0 on the row it locked. When no
//     row was found the function did not run and the server reports 0, whatever an earlier
//     statement set. The side effect: LAST_INSERT_ID() in the session then says 1 or 0.
func statements(d Dialect, table string) (queries, error) {
	notOlder := "(epoch < %[1]s OR (epoch = %[1]s AND generation <= %[2]s))"
	newer := "(epoch < %[1]s OR (epoch = %[1]s AND generation < %[2]s))"
	switch d {
	case Postgres:
		q := queries{
			create: `CREATE TABLE IF NOT EXISTS ` + table + ` (
				resource   text PRIMARY KEY,
				epoch      bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
				generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0))`,
			add:   `INSERT INTO ` + table + ` (resource) VALUES ($1) ON CONFLICT (resource) DO NOTHING`,
			raise: `UPDATE ` + table + ` SET epoch = $2, generation = $3 WHERE resource = $1 AND ` + fmt.Sprintf(newer, "$2", "$3") + ` RETURNING 1`,
			// CASE evaluates the share lock only when the raise did not happen: the row is then
			// not one the statement has updated.
			answer: `SELECT CASE WHEN EXISTS (SELECT FROM fenced_raise) THEN true
				ELSE EXISTS (SELECT FROM ` + table + ` WHERE resource = $1 AND ` + fmt.Sprintf(notOlder, "$2", "$3") + ` FOR SHARE) END`,
			mark: `SELECT epoch, generation FROM ` + table + ` WHERE resource = $1`,
			checkArgs: func(r string, t fenced.Token) []any {
				return []any{r, t.Epoch, t.Generation}
			},
		}
		q.check, q.answers = `WITH fenced_raise AS (`+q.raise+`) `+q.answer, true
		return q, nil
	case SQLite:
		return queries{
			create: `CREATE TABLE IF NOT EXISTS ` + table + ` (
				resource   TEXT PRIMARY KEY,
				epoch      INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0),
				generation INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0))`,
			add:   `INSERT INTO ` + table + ` (resource) VALUES (?1) ON CONFLICT (resource) DO NOTHING`,
			check: `UPDATE ` + table + ` SET epoch = ?2, generation = ?3 WHERE resource = ?1 AND ` + fmt.Sprintf(notOlder, "?2", "?3"),
			mark:  `SELECT epoch, generation FROM ` + table + ` WHERE resource = ?1`,
			checkArgs: func(r string, t fenced.Token) []any {
				return []any{r, t.Epoch, t.Generation}
			},
		}, nil
	case MySQL:
		// VARBINARY: names compare byte for byte (no case folding, no trailing-space padding).
		return queries{
			create: `CREATE TABLE IF NOT EXISTS ` + table + ` (
				resource   VARBINARY(255) NOT NULL PRIMARY KEY,
				epoch      BIGINT NOT NULL DEFAULT 0 CHECK (epoch >= 0),
				generation BIGINT NOT NULL DEFAULT 0 CHECK (generation >= 0)) ENGINE=InnoDB`,
			add: `INSERT INTO ` + table + ` (resource) VALUES (?) ON DUPLICATE KEY UPDATE resource = resource`,
			// MySQL assigns left to right, so the condition is in WHERE, evaluated first.
			check:      `UPDATE ` + table + ` SET epoch = ?, generation = ? WHERE resource = ? AND LAST_INSERT_ID` + fmt.Sprintf(notOlder, "?", "?"),
			byInsertID: true,
			mark:       `SELECT epoch, generation FROM ` + table + ` WHERE resource = ?`,
			checkArgs: func(r string, t fenced.Token) []any {
				return []any{t.Epoch, t.Generation, r, t.Epoch, t.Epoch, t.Generation}
			},
		}, nil
	}
	return queries{}, fmt.Errorf("gate: unknown dialect %d", int(d))
}
