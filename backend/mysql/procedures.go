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
	switch s.kind {
	case kindQuery:
		return "BEGIN\n" + s.body + ";\nEND"
	case kindExec:
		return "BEGIN\n" + s.body + ";\nSELECT ROW_COUNT(), LAST_INSERT_ID();\nEND"
	}
	// kindTx: the procedure owns its transaction, so that no session can run one of its
	// statements without the other. Any error before COMMIT rolls back and is passed on; an
	// error from COMMIT itself is passed on as ER_ERROR_DURING_COMMIT, whose outcome the driver
	// treats as unknown.
	return `BEGIN
DECLARE matched BIGINT DEFAULT 0;
DECLARE last_id BIGINT DEFAULT 0;
DECLARE committing BOOLEAN DEFAULT FALSE;
DECLARE EXIT HANDLER FOR SQLEXCEPTION
BEGIN
  IF committing THEN
    RESIGNAL SET MYSQL_ERRNO = ` + fmt.Sprint(erErrorDuringCommit) + `;
  END IF;
  ROLLBACK;
  RESIGNAL;
END;
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
START TRANSACTION;
` + s.first.body + `;
SET matched = ROW_COUNT(), last_id = LAST_INSERT_ID();
IF matched = 1 THEN
` + s.second.body + `;
END IF;
SET committing = TRUE;
COMMIT;
SELECT matched, last_id;
END`
}

// Grant installs every operation as a SQL SECURITY DEFINER procedure (definer: the user Grant
// runs as, who must own the tables and hold CREATE ROUTINE, ALTER ROUTINE and GRANT OPTION) and
// grants role EXECUTE on each, and nothing else. role names a user account, 'role'@'%', which
// must exist; a session connected as it cannot read or write fenced's tables, only call the
// procedures, and the driver finds that out by itself (see Driver.Migrate).
//
// A procedure whose body is already current is left alone. One that changed (after an upgrade
// of fenced) is dropped and created again, and MySQL then drops every EXECUTE grant on it: run
// Grant again for each role.
func (d *Driver) Grant(ctx context.Context, role string) error {
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
	if err := installProcedures(ctx, conn, procedureStmts); err != nil {
		return err
	}
	grantee := "'" + role + "'@'%'" // the core allows only letters, digits and underscores
	for _, s := range procedureStmts {
		name := "fenced_" + s.name
		if _, err := conn.ExecContext(ctx, "GRANT EXECUTE ON PROCEDURE `"+schema+"`."+name+" TO "+grantee); err != nil {
			return fmt.Errorf("grant execute on %s: %w", name, err)
		}
	}
	return nil
}
