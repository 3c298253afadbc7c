package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// migrationLockWait is how long Migrate waits for a concurrent migration when ctx has no deadline.
const migrationLockWait = time.Minute

// Migrate applies the embedded migrations that have not run yet, installs the procedures
// the driver always calls (the publication's and the epoch bump's transactions), and
// re-creates every other procedure Grant installed whose text is not this build's (which
// drops its EXECUTE grants: run Grant again for each role). Concurrent
// callers, in any process, are serialized by a named server lock (GET_LOCK) held on one
// connection. DDL commits implicitly in MySQL, so a migration is not atomic with its version
// row; each migration is written to be harmless when run again.
//
// On a session that may not write the tables (a role given access by Grant) Migrate changes
// nothing: it checks, through the procedures, that the schema is current and that the
// connection counts matched rows.
func (d *Driver) Migrate(ctx context.Context) error {
	procs, known, err := d.detect(ctx)
	if err != nil {
		return err
	}
	var readOnly bool
	if err := d.db.QueryRowContext(ctx, sqlReadOnly).Scan(&readOnly); err != nil {
		return fmt.Errorf("check whether the server is read-only: %w", err)
	}
	if readOnly {
		return d.checkReadOnly(ctx, procs, known)
	}
	if known && procs {
		return d.checkGrantedSchema(ctx)
	}

	conn, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()

	wait := migrationLockWait
	if deadline, ok := ctx.Deadline(); ok {
		wait = max(time.Until(deadline), time.Second)
	}
	// Lock names are server-wide and at most 64 characters, hence the digest of the database.
	const lockName = `CONCAT('fenced.migrate.', MD5(DATABASE()))`
	var locked sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+lockName+`, ?)`, int(wait.Seconds())).Scan(&locked); err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	if locked.Int64 != 1 {
		return fmt.Errorf("take migration lock: another migration held it for %s", wait)
	}
	defer func() {
		var released sql.NullInt64
		err := conn.QueryRowContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(`+lockName+`)`).Scan(&released)
		if err != nil || released.Int64 != 1 {
			// A connection that may still hold the lock must not go back to the pool.
			_ = conn.Raw(func(any) error { return sqldriver.ErrBadConn })
		}
	}()

	if err := migrate(ctx, conn); err != nil {
		return err
	}
	if err := installProcedures(ctx, conn, alwaysCalled, procedureStmts); err != nil {
		return err
	}
	matched, _, err := run(ctx, conn, false, sqlCheckFoundRows, &params{})
	if err != nil {
		return fmt.Errorf("check matched rows: %w", err)
	}
	if err := foundRows(matched); err != nil {
		return err
	}
	d.mode.CompareAndSwap(modeUnknown, modeDirect)
	return nil
}

// alwaysCalled are the statements every session runs as procedures: each is a transaction of
// two statements, which as a procedure takes one round trip and cannot be run by halves.
var alwaysCalled = []*stmt{sqlPublish, sqlPublishAndRelease, sqlBumpEpoch}

func foundRows(matched int64) error {
	if matched != 1 {
		return errors.New("check matched rows: the connection reports changed rows, not matched rows; " +
			"open it with clientFoundRows=true")
	}
	return nil
}

// sqlReadOnly: a replica set read_only (MySQL's super_read_only implies it).
const sqlReadOnly = `SELECT @@global.read_only`

// checkReadOnly is Migrate on a read-only server (a replica): nothing to do when the schema is
// current, so that reads work there; refused with the reason when it is not, since a replica
// must be migrated through its primary.
func (d *Driver) checkReadOnly(ctx context.Context, procs, known bool) error {
	latest, err := latestVersion()
	if err != nil {
		return err
	}
	version, current := 0, false
	if known {
		if _, err := query(ctx, d.db, procs, sqlSchemaVersion, &params{}, &version); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		current = version == latest
		if current && !procs {
			conn, err := d.db.Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			stale, err := staleProcedures(ctx, conn, alwaysCalled)
			if err != nil {
				return err
			}
			current = len(stale) == 0
		}
	}
	if !current {
		return driver.NotApplied(fmt.Errorf("the schema needs migrating (it is at version %d, this code needs %d) and %w",
			version, latest, driver.ErrReadOnly))
	}
	return nil
}

// checkGrantedSchema is Migrate for a session that may only call the procedures.
func (d *Driver) checkGrantedSchema(ctx context.Context) error {
	var version int
	found, err := query(ctx, d.db, true, sqlSchemaVersion, &params{}, &version)
	if err != nil {
		return fmt.Errorf("read schema version through fenced_%s: %w", sqlSchemaVersion.name, err)
	}
	latest, err := latestVersion()
	if err != nil {
		return err
	}
	if !found || version < latest {
		return fmt.Errorf("read schema version: it is %d, this build needs %d; "+
			"migrate as the tables' owner, then grant this role again", version, latest)
	}
	matched, _, err := run(ctx, d.db, true, sqlCheckFoundRows, &params{})
	if err != nil {
		return fmt.Errorf("check matched rows through fenced_%s: %w", sqlCheckFoundRows.name, err)
	}
	return foundRows(matched)
}

type migration struct {
	version int
	name    string
}

func migrationFiles() ([]migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []migration
	for _, name := range names {
		version, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, "migrations/"), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: bad version: %w", name, err)
		}
		out = append(out, migration{version, name})
	}
	return out, nil
}

func latestVersion() (int, error) {
	ms, err := migrationFiles()
	if err != nil || len(ms) == 0 {
		return 0, err
	}
	return ms[len(ms)-1].version, nil
}

// Errors a migration that ran before (and was interrupted before its version row) meets again:
// MySQL has no ADD COLUMN IF NOT EXISTS or CREATE INDEX IF NOT EXISTS.
const (
	erDupFieldName = 1060
	erDupKeyName   = 1061
)

func migrate(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS fenced_schema_migrations (
    version    INT         NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL
) ENGINE = InnoDB`); err != nil {
		return fmt.Errorf("create migrations table: %w", err)
	}
	var current int
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM fenced_schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	ms, err := migrationFiles()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.version <= current {
			continue
		}
		body, err := migrations.ReadFile(m.name)
		if err != nil {
			return err
		}
		for _, stmt := range statements(string(body)) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				if n := serverError(err); n == erDupFieldName || n == erDupKeyName {
					continue // applied before the run that was interrupted
				}
				return fmt.Errorf("apply migration %s: %w", m.name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO fenced_schema_migrations (version, applied_at)
VALUES (?, UTC_TIMESTAMP(6))`, m.version); err != nil {
			return fmt.Errorf("record migration %s: %w", m.name, err)
		}
	}
	return nil
}

// statements splits a migration into its statements: the driver sends one at a time, since
// multiStatements is off by default and should stay off. A statement ends with ';' at the end
// of a line.
func statements(body string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(body) {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, cur.String())
	}
	return out
}

// installProcedures creates each of install's procedures that is missing or differs from the
// current statement text, and re-creates each of refresh's procedures that exists and differs
// (one Grant installed with an older text). Dropping a procedure drops its EXECUTE grants too
// (see Grant), so a role whose procedure was re-created is refused until it is granted again:
// an older text may lack a check the current one makes, and must not stay callable.
func installProcedures(ctx context.Context, conn *sql.Conn, install, refresh []*stmt) error {
	current, err := procedureDefinitions(ctx, conn)
	if err != nil {
		return err
	}
	stale := staleIn(current, install)
	for _, s := range staleIn(current, refresh) {
		if _, ok := current["fenced_"+s.name]; ok && !contains(procedureNames(stale), s.name) {
			stale = append(stale, s)
		}
	}
	if len(stale) > 0 { // the procedures' prefix check reads it
		if _, err := conn.ExecContext(ctx, sqlGrantsTable); err != nil {
			return fmt.Errorf("create fenced_grants: %w", err)
		}
	}
	for _, s := range stale {
		name := "fenced_" + s.name
		if _, err := conn.ExecContext(ctx, "DROP PROCEDURE IF EXISTS "+name); err != nil {
			return fmt.Errorf("drop procedure %s: %w", name, err)
		}
		if _, err := conn.ExecContext(ctx, procedure(s)); err != nil {
			return fmt.Errorf("create procedure %s: %w", name, err)
		}
	}
	return nil
}

func procedureNames(stmts []*stmt) []string {
	var out []string
	for _, s := range stmts {
		out = append(out, s.name)
	}
	return out
}

// staleProcedures returns those of stmts whose procedure is missing or differs from the
// current statement text.
func staleProcedures(ctx context.Context, conn *sql.Conn, stmts []*stmt) ([]*stmt, error) {
	current, err := procedureDefinitions(ctx, conn)
	if err != nil {
		return nil, err
	}
	return staleIn(current, stmts), nil
}

// procedureDefinitions maps the name of each of fenced's procedures to its body.
func procedureDefinitions(ctx context.Context, conn *sql.Conn) (map[string]string, error) {
	current := map[string]string{}
	rows, err := conn.QueryContext(ctx, `SELECT ROUTINE_NAME, ROUTINE_DEFINITION FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME LIKE 'fenced\_%'`)
	if err != nil {
		return nil, fmt.Errorf("list procedures: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var def sql.NullString
		if err := rows.Scan(&name, &def); err != nil {
			return nil, fmt.Errorf("list procedures: %w", err)
		}
		current[name] = def.String
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("list procedures: %w", err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list procedures: %w", err)
	}
	return current, nil
}

// staleIn returns those of stmts whose procedure is missing from current or differs from it.
func staleIn(current map[string]string, stmts []*stmt) []*stmt {
	var stale []*stmt
	for _, s := range stmts {
		if def, ok := current["fenced_"+s.name]; !ok || def != procedureBody(s) {
			stale = append(stale, s)
		}
	}
	return stale
}
