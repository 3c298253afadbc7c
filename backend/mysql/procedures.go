package mysql

import (
	"context"
	"fmt"
	"strings"

	"github.com/fenced-dev/fenced/driver"
)

var _ driver.Granter = (*Driver)(nil)

// erErrorDuringCommit (ER_ERROR_DURING_COMMIT) is what a transactional procedure reports when
// its COMMIT failed: the outcome of that is unknown, unlike an error before it.
const erErrorDuringCommit = 1180

// procedure returns the CREATE PROCEDURE statement for s. Its body is s's own text with the
// named placeholders turned into parameters, so a procedure always runs exactly the statement
// the driver would have sent. A statement that writes returns (matched rows, LAST_INSERT_ID())
// as one row, which is what the driver reads from a direct statement's reply; ROW_COUNT()
// counts matched rows on a connection made with clientFoundRows, as the reply does.
func procedure(s *stmt) string {
	var decl []string
	for _, p := range s.params {
		decl = append(decl, "IN p_"+p+" "+paramTypes[p])
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE DEFINER = CURRENT_USER PROCEDURE fenced_%s(%s)\n", s.name, strings.Join(decl, ", "))
	if s.kind == kindQuery {
		b.WriteString("READS SQL DATA SQL SECURITY DEFINER\n")
	} else {
		b.WriteString("MODIFIES SQL DATA SQL SECURITY DEFINER\n")
	}
	b.WriteString(procedureBody(s))
	return b.String()
}

// procedureBody is the BEGIN ... END block of s's procedure, which is also what the server
// reports as its definition (so that Grant can tell whether it is current).
func procedureBody(s *stmt) string {
	check := ""
	if contains(s.params, "resource") {
		check = prefixCheck
	}
	switch s.kind {
	case kindQuery:
		return "BEGIN\n" + utcZone + check + s.body + ";\n" + sessionZone + "END"
	case kindExec:
		return "BEGIN\n" + utcZone + check + s.body + ";\nSELECT ROW_COUNT(), LAST_INSERT_ID();\n" + sessionZone + "END"
	}
	// kindTx: the procedure owns its transaction, so that no session can run one of its
	// statements without the other. Any error before COMMIT that the handler catches rolls
	// back and is passed on; an error after COMMIT began is passed on as
	// ER_ERROR_DURING_COMMIT, whose outcome the driver treats as unknown. Its handler also puts
	// the caller's time zone back (see utcZone). A KILL QUERY or max_statement_time ends
	// whichever statement of the CALL is running, after its COMMIT too (the handler then
	// reports 1180), or, in a kindExec procedure, after its autocommit statement (reported as
	// it is, 1317 or 1969), so the driver treats these errors as unknown (classify).
	return `BEGIN
DECLARE matched BIGINT DEFAULT 0;
DECLARE last_id BIGINT DEFAULT 0;
DECLARE committing BOOLEAN DEFAULT FALSE;
DECLARE session_zone VARCHAR(64) DEFAULT @@session.time_zone;
DECLARE EXIT HANDLER FOR SQLEXCEPTION
BEGIN
  SET time_zone = session_zone;
  IF committing THEN
    RESIGNAL SET MYSQL_ERRNO = ` + fmt.Sprint(erErrorDuringCommit) + `;
  END IF;
  ROLLBACK;
  RESIGNAL;
END;
SET time_zone = '+00:00';
` + check + `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
START TRANSACTION;
` + s.first.body + `;
SET matched = ROW_COUNT(), last_id = LAST_INSERT_ID();
IF matched = 1 THEN
` + s.second.body + `;
END IF;
SET committing = TRUE;
COMMIT;
SELECT matched, last_id;
` + sessionZone + `END`
}

// utcZone begins every procedure that has no handler of its own: it pins the session's time
// zone to UTC for the procedure's statements and puts the caller's zone back on any error.
// In UTC, NOW(6) and UTC_TIMESTAMP(6) are the same reading, so clockAfterLock is SYSDATE(6),
// the server's clock, whatever the session set: SET timestamp moves the first two alike, and
// nothing a session sets moves SYSDATE(). In the session's own zone the subtraction would use
// the zone's offset at the forged instant, which is not its offset now when the zone has
// daylight saving or changed its offset (Pacific/Apia went from -11:00 to +13:00), and the
// clock would move by the difference (invariant 15; TestForgedZoneOffsetIgnored). The caller's
// zone is kept in a local variable, which no session can reach. A killed CALL ends without
// running the handler and leaves the session in UTC, which decides nothing.
const utcZone = `DECLARE session_zone VARCHAR(64) DEFAULT @@session.time_zone;
DECLARE EXIT HANDLER FOR SQLEXCEPTION
BEGIN
  SET time_zone = session_zone;
  RESIGNAL;
END;
SET time_zone = '+00:00';
`

// sessionZone ends every procedure: the caller's time zone back, as it set it.
const sessionZone = "SET time_zone = session_zone;\n"

// prefixCheck begins every procedure whose statement names a resource. The caller is the user
// part of USER(), the account the session logged in as (inside a SQL SECURITY DEFINER
// procedure CURRENT_USER() is the definer; USER() cannot be set by the session). A caller with
// rows in fenced_grants, which only Grant writes, may use a resource when one of its prefixes
// begins the name (the empty prefix for every resource); a caller without rows was not set up by Grant (the
// tables' owner, whose publications go through procedures too) and is not checked.
const prefixCheck = `IF EXISTS (SELECT 1 FROM fenced_grants WHERE grantee = SUBSTRING_INDEX(USER(), '@', 1))
  AND NOT EXISTS (SELECT 1 FROM fenced_grants WHERE grantee = SUBSTRING_INDEX(USER(), '@', 1)
                  AND LEFT(p_resource, LENGTH(prefix)) = prefix) THEN
  SIGNAL SQLSTATE '` + sqlstatePrefix + `' SET MYSQL_ERRNO = ` + erPrefix + `,
    MESSAGE_TEXT = 'the resource is outside the prefixes this role was granted';
END IF;
`

// The prefix check's error, and the server's refusal to run a procedure the role was not
// granted (ER_PROCACCESS_DENIED_ERROR).
const (
	sqlstatePrefix    = "FNC02"
	erPrefix          = "50002"
	erPrefixNumber    = 50002
	erProcAccess      = 1370
	erNonexistGrant   = 1141
	erNoSuchProcGrant = 1403
)

// sqlGrantsTable holds the prefixes of each role Grant set up (the empty prefix for every resource).
const sqlGrantsTable = `CREATE TABLE IF NOT EXISTS fenced_grants (
    grantee VARBINARY(80)  NOT NULL,
    prefix  VARBINARY(255) NOT NULL,
    PRIMARY KEY (grantee, prefix)
) ENGINE = InnoDB`

// access is the level a procedure needs and the operation it performs, in words.
func access(s *stmt) (driver.Access, string) {
	switch s.name {
	case "provision":
		return driver.AccessAdmin, "provision"
	case "acquire", "read_lease":
		return driver.AccessWorker, "acquire"
	case "renew":
		return driver.AccessWorker, "renew"
	case "publish", "publish_and_release":
		return driver.AccessWorker, "publish"
	case "release":
		return driver.AccessWorker, "release"
	case "resolve":
		return driver.AccessWorker, "resolve an operation"
	case "bump_epoch":
		return driver.AccessAdmin, "bump the epoch"
	case "prune_operations":
		return driver.AccessAdmin, "prune operation records"
	case "read_operation":
		return driver.AccessReader, "read an operation"
	case "read", "read_payload":
		return driver.AccessReader, "read"
	}
	// schema_version, check_found_rows, table_engines: what Migrate and CheckDurability
	// read (check_found_rows writes the value already stored).
	return driver.AccessReader, "read the schema"
}

// denied turns the server's refusal of s for lack of rights into a *driver.PermissionError
// naming the operation and the account (read with one more query, on this error only): a
// procedure the role was not granted, a table it may not touch, or a resource outside its
// prefixes. Each is an error before anything changed.
func denied(ctx context.Context, e execer, s *stmt, p *params, err error) error {
	n := serverError(err)
	if n != erProcAccess && n != erTableAccessDenied && n != erPrefixNumber {
		return err
	}
	_, op := access(s)
	pe := &driver.PermissionError{Operation: op, Err: err}
	if n == erPrefixNumber {
		pe.Resource = p.resource
	}
	if _, qerr := queryText(ctx, e, `SELECT SUBSTRING_INDEX(USER(), '@', 1)`, nil, &pe.Role); qerr != nil {
		pe.Role = "(unknown)"
	}
	return pe
}

// Grant installs every operation as a SQL SECURITY DEFINER procedure (definer: the user Grant
// runs as, who must own the tables and hold CREATE ROUTINE, ALTER ROUTINE and GRANT OPTION),
// grants role EXECUTE on those spec.Access includes and revokes it on the others, and records
// spec.Prefixes in fenced_grants. role names a user account, 'role'@'%', which must exist; a
// session connected as it cannot read or write fenced's tables, only call the procedures, and
// the driver finds that out by itself (see Driver.Migrate).
//
// It refuses, before changing anything, an account that its EXECUTE grants would not confine,
// whether the right is its own, a role's it may set or PUBLIC's: one that may create temporary
// tables in the database (a temporary table shadows the base table of the same name for its
// session, inside a SQL SECURITY DEFINER procedure too, so such an account could feed the
// procedures a fenced_meta or fenced_resources of its own making and get any token it likes),
// one that may write fenced's tables directly, and one with EXECUTE on the database or on every
// database when its level excludes a procedure (that cannot be revoked per procedure). To see
// those rights it reads MariaDB's privilege tables, so the user Grant runs as needs SELECT on
// the mysql database; without it Grant refuses, since it cannot tell.
//
// A procedure whose body is already current is left alone. One that changed (after an upgrade
// of fenced) is dropped and created again, by Grant or by the owner's Migrate, and MySQL then
// drops every EXECUTE grant on it: run Grant again for each role. GRANT and REVOKE commit at once: an interrupted Grant can leave
// a role with part of its new rights; run it again.
func (d *Driver) Grant(ctx context.Context, role string, spec driver.GrantSpec) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var readOnly bool
	if err := conn.QueryRowContext(ctx, sqlReadOnly).Scan(&readOnly); err != nil {
		return fmt.Errorf("check whether the server is read-only: %w", err)
	}
	if readOnly {
		return driver.NotApplied(driver.ErrReadOnly)
	}
	var schema string
	if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&schema); err != nil {
		return fmt.Errorf("read database name: %w", err)
	}
	grantee := "'" + role + "'@'%'" // the core allows only letters, digits and underscores
	if err := checkAccountRights(ctx, conn, role, schema, spec.Access); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, sqlGrantsTable); err != nil {
		return fmt.Errorf("create fenced_grants: %w", err)
	}
	if err := installProcedures(ctx, conn, procedureStmts, nil); err != nil {
		return err
	}
	for _, s := range procedureStmts {
		name := "fenced_" + s.name
		need, _ := access(s)
		if spec.Access.Includes(need) {
			if _, err := conn.ExecContext(ctx, "GRANT EXECUTE ON PROCEDURE `"+schema+"`."+name+" TO "+grantee); err != nil {
				return fmt.Errorf("grant execute on %s: %w", name, err)
			}
			continue
		}
		_, err := conn.ExecContext(ctx, "REVOKE EXECUTE ON PROCEDURE `"+schema+"`."+name+" FROM "+grantee)
		if n := serverError(err); err != nil && n != erNonexistGrant && n != erNoSuchProcGrant {
			return fmt.Errorf("revoke execute on %s: %w", name, err)
		}
	}
	prefixes := spec.Prefixes
	if len(prefixes) == 0 {
		prefixes = []string{""}
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `DELETE FROM fenced_grants WHERE grantee = ?`, role); err != nil {
		return fmt.Errorf("record the prefixes of %s: %w", role, err)
	}
	for _, p := range prefixes {
		if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO fenced_grants (grantee, prefix) VALUES (?, ?)`, role, p); err != nil {
			return fmt.Errorf("record the prefixes of %s: %w", role, err)
		}
	}
	return tx.Commit()
}
