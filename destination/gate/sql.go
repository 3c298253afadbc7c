package gate

import (
	"fmt"

	"github.com/fenced-dev/fenced"
)

// The check is one statement: it raises the mark only where the presented token is not older
// (epoch first, then generation), and counts every accepted check, so that an equal token
// still changes the row and MySQL reports it as affected whatever its found-rows setting.
func statements(d Dialect, table string) (queries, error) {
	cond := "(epoch < %[1]s OR (epoch = %[1]s AND generation <= %[2]s))"
	switch d {
	case Postgres:
		return queries{
			create: `CREATE TABLE IF NOT EXISTS ` + table + ` (
				resource   text PRIMARY KEY,
				epoch      bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
				generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0),
				checks     bigint NOT NULL DEFAULT 0)`,
			add:   `INSERT INTO ` + table + ` (resource) VALUES ($1) ON CONFLICT (resource) DO NOTHING`,
			check: `UPDATE ` + table + ` SET epoch = $2, generation = $3, checks = checks + 1 WHERE resource = $1 AND ` + fmt.Sprintf(cond, "$2", "$3"),
			mark:  `SELECT epoch, generation FROM ` + table + ` WHERE resource = $1`,
			checkArgs: func(r string, t fenced.Token) []any {
				return []any{r, t.Epoch, t.Generation}
			},
		}, nil
	case SQLite:
		return queries{
			create: `CREATE TABLE IF NOT EXISTS ` + table + ` (
				resource   TEXT PRIMARY KEY,
				epoch      INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0),
				generation INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
				checks     INTEGER NOT NULL DEFAULT 0)`,
			add:   `INSERT INTO ` + table + ` (resource) VALUES (?1) ON CONFLICT (resource) DO NOTHING`,
			check: `UPDATE ` + table + ` SET epoch = ?2, generation = ?3, checks = checks + 1 WHERE resource = ?1 AND ` + fmt.Sprintf(cond, "?2", "?3"),
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
				generation BIGINT NOT NULL DEFAULT 0 CHECK (generation >= 0),
				checks     BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB`,
			add: `INSERT INTO ` + table + ` (resource) VALUES (?) ON DUPLICATE KEY UPDATE resource = resource`,
			// MySQL assigns left to right, so the condition is in WHERE, evaluated first.
			check: `UPDATE ` + table + ` SET epoch = ?, generation = ?, checks = checks + 1 WHERE resource = ? AND ` + fmt.Sprintf(cond, "?", "?"),
			mark:  `SELECT epoch, generation FROM ` + table + ` WHERE resource = ?`,
			checkArgs: func(r string, t fenced.Token) []any {
				return []any{t.Epoch, t.Generation, r, t.Epoch, t.Epoch, t.Generation}
			},
		}, nil
	}
	return queries{}, fmt.Errorf("gate: unknown dialect %d", int(d))
}
