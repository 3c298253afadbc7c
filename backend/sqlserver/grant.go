package sqlserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/fenced-dev/fenced/driver"
)

var _ driver.Granter = (*Driver)(nil)

// roleName is what Grant accepts: the core's rule for role names (letters, digits and
// underscores, not starting with a digit, at most 63 bytes), checked here again because the
// name is written into GRANT and DENY statements, which take no parameters.
var roleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ErrGrantInDBO is returned by Grant when the tables are in schema dbo (the default): the
// DENY ALTER ON SCHEMA that keeps a role from replacing the procedures would deny it every
// change of definition of every object in dbo, the application's own included. Use a schema
// of fenced's own (Config.Schema, or schema=NAME in the URL), migrated afresh.
var ErrGrantInDBO = errors.New("refusing to restrict a role on schema dbo, which holds the application's objects too; give fenced a schema of its own (Config.Schema or ?schema=NAME)")

// Grant installs one procedure per operation in the driver's schema, their bodies the driver's
// own statements, and lets role execute them and nothing else on fenced's tables:
//
//   - CREATE OR ALTER PROCEDURE for every operation that Migrate has not installed in this
//     version (see routines in sql.go);
//   - the role is created (CREATE ROLE) when no database principal has that name; a built-in
//     principal (public, dbo, guest, sys, INFORMATION_SCHEMA, a fixed role) is refused;
//   - GRANT EXECUTE on each procedure spec.Access includes (REVOKE on the others, so that
//     granting again with a lower level takes rights away), SELECT on fenced_schema_migrations and VIEW DEFINITION
//     on the schema, so that Migrate, which fenced.New runs, sees the schema, its tables and
//     its version (metadata is hidden from a principal without a permission on it) and finds
//     it up to date;
//   - DENY INSERT, UPDATE, DELETE on every fenced table and ALTER on the schema (so that the
//     procedures cannot be replaced). DENY wins over a grant the role has through another role
//     (db_datawriter, say) and replaces an earlier GRANT to the role itself.
//
// The procedures have no EXECUTE AS: they rely on ownership chaining. A procedure and the
// tables it uses are all owned by the schema's owner, so SQL Server checks the caller's
// EXECUTE on the procedure and not its permissions on the tables - the DENYs do not stop the
// procedures, and stop everything else. The caller's identity is kept (no impersonation to
// audit or to grant), and the chain breaks, failing closed with a permission error, if
// someone gives a table another owner. The procedures use static SQL only, which the chain
// covers (dynamic SQL would not be).
//
// A driver connected as a member of role finds by itself that it may not update the tables
// and that the procedures exist, and from then on calls them (see Driver.statement): nothing
// needs configuring. Members of db_owner, the database owner and sysadmin are not bound by
// DENY; the role's members must not be among them. After upgrading this package, run Grant
// again so that the procedures are the new statements.
//
// The role's logins also need to read their database's row in sys.database_recovery_status
// (VIEW ANY DATABASE, which public holds unless it was revoked): the incarnation check reads it
// with the caller's permissions, which ownership chaining does not extend.
//
// Grant refuses schema dbo (ErrGrantInDBO). Everything runs in one transaction: it is all
// installed, or none of it.
func (d *Driver) Grant(ctx context.Context, role string, spec driver.GrantSpec) (err error) {
	if d.refused != nil {
		return d.refused
	}
	if len(spec.Prefixes) > 0 {
		return fmt.Errorf("grant %s: prefixes are not supported on SQL Server yet; grant without --prefix", role)
	}
	if !roleName.MatchString(role) {
		return fmt.Errorf("grant: role %q is not a plain identifier (letters, digits, underscores)", role)
	}
	if strings.EqualFold(d.schema, "dbo") {
		return fmt.Errorf("grant %s: %w", role, ErrGrantInDBO)
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return translate("begin grant", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := d.installProcedures(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, grantBatch(d.sql, d.schema, role, spec.Access), sql.Named("role", role)); err != nil {
		return translate("grant to "+role, err)
	}
	if err := tx.Commit(); err != nil {
		return translate("commit grant", err)
	}
	return nil
}

// grantBatch is the batch that creates role if needed and sets its permissions. Identifiers
// are bracket-quoted (quoteName); @role is a parameter wherever T-SQL allows one.
func grantBatch(s statements, schema, role string, level driver.Access) string {
	r := quoteName(role)
	var b strings.Builder
	b.WriteString(`SET XACT_ABORT ON;
IF EXISTS (SELECT 1 FROM sys.database_principals
           WHERE name = @role AND (principal_id < 5 OR is_fixed_role = 1))
    THROW 50000, N'fenced grant: refusing to restrict a built-in database principal', 1;
IF DATABASE_PRINCIPAL_ID(@role) IS NULL
    CREATE ROLE ` + r + `;
`)
	for o, p := range s.procedure {
		if level.Includes(access[o]) {
			b.WriteString("GRANT EXECUTE ON OBJECT::" + p + " TO " + r + ";\n")
		} else { // granting a lower level takes the rest away
			b.WriteString("REVOKE EXECUTE ON OBJECT::" + p + " FROM " + r + ";\n")
		}
	}
	b.WriteString("GRANT SELECT ON OBJECT::" + s.table["fenced_schema_migrations"] + " TO " + r + ";\n")
	b.WriteString("GRANT VIEW DEFINITION ON SCHEMA::" + quoteName(schema) + " TO " + r + ";\n")
	for _, t := range tables {
		b.WriteString("DENY INSERT, UPDATE, DELETE ON OBJECT::" + s.table[t.name] + " TO " + r + ";\n")
	}
	b.WriteString("DENY ALTER ON SCHEMA::" + quoteName(schema) + " TO " + r + ";")
	return b.String()
}
