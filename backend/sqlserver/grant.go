package sqlserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf16"

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
// spec.Prefixes limits the role to resource names that begin with one of them: Grant replaces
// the role's rows in fenced_grants (prefixRows; none given: the empty prefix, every resource),
// which the procedures that take a resource check (prefixCheck in sql.go), and which the role,
// like every fenced table, may not change. A user that is a member of several granted roles
// may use the prefixes of all of them.
//
// Grant refuses schema dbo (ErrGrantInDBO). Everything runs in one transaction: it is all
// installed, or none of it.
func (d *Driver) Grant(ctx context.Context, role string, spec driver.GrantSpec) (err error) {
	if d.refused != nil {
		return d.refused
	}
	if !roleName.MatchString(role) {
		return fmt.Errorf("grant: role %q is not a plain identifier (letters, digits, underscores)", role)
	}
	if strings.EqualFold(d.schema, "dbo") {
		return fmt.Errorf("grant %s: %w", role, ErrGrantInDBO)
	}
	prefixes, err := prefixRows(spec.Prefixes)
	if err != nil {
		return fmt.Errorf("grant %s: %w", role, err)
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
	args := []any{sql.Named("role", role)}
	for i, p := range prefixes {
		args = append(args, sql.Named(fmt.Sprintf("prefix%d", i), p))
	}
	if _, err := tx.ExecContext(ctx, grantBatch(d.sql, d.schema, role, spec.Access, len(prefixes)), args...); err != nil {
		return translate("grant to "+role, err)
	}
	if err := tx.Commit(); err != nil {
		return translate("commit grant", err)
	}
	return nil
}

// maxPrefixes bounds the prefixes of one grant: each is a parameter of the grant batch, and a
// request carries at most 2,100.
const maxPrefixes = 1000

// prefixRows is what Grant writes to fenced_grants for the prefixes asked for: the empty
// prefix (every resource) when none were, otherwise each prefix exactly as given (%, _, [ and
// spaces are ordinary characters: the procedures compare bytes, see prefixCheck), without
// duplicates and without those that another prefix in the list begins (they allow nothing
// more). Dropping those also keeps the primary key, which like every = on NVARCHAR ignores
// trailing spaces, from seeing "a" and "a " as one key: one begins the other. A prefix longer
// than a resource name can be (255 UTF-16 code units) is refused, as it could match nothing.
func prefixRows(prefixes []string) ([]string, error) {
	if len(prefixes) == 0 {
		return []string{""}, nil
	}
	if len(prefixes) > maxPrefixes {
		return nil, fmt.Errorf("record prefixes: %d prefixes given, at most %d are accepted", len(prefixes), maxPrefixes)
	}
	sorted := slices.Clone(prefixes)
	slices.Sort(sorted) // a prefix sorts before every string it begins, and those follow it together
	var rows []string
	for _, p := range sorted {
		if n := len(utf16.Encode([]rune(p))); n > resourceMax {
			return nil, fmt.Errorf("record prefixes: prefix %q is %d UTF-16 code units long, longer than a resource name can be (%d)", p, n, resourceMax)
		}
		if len(rows) > 0 && strings.HasPrefix(p, rows[len(rows)-1]) {
			continue // covered by the last one kept, or equal to it
		}
		rows = append(rows, p)
	}
	return rows, nil
}

// resourceMax is the width of fenced_resources.resource and of fenced_grants.prefix.
const resourceMax = 255

// grantBatch is the batch that creates role if needed, sets its permissions and replaces its
// rows in fenced_grants with the prefixes passed as @prefix0 ... @prefix<n-1> (prefixRows).
// Identifiers are bracket-quoted (quoteName); @role is a parameter wherever T-SQL allows one.
// Grant runs it inside its transaction with XACT_ABORT ON: an error anywhere leaves the role's
// rights and prefixes as they were.
func grantBatch(s statements, schema, role string, level driver.Access, prefixes int) string {
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
	b.WriteString("DENY ALTER ON SCHEMA::" + quoteName(schema) + " TO " + r + ";\n")
	// Re-granting replaces the prefixes: those the new grant does not list are gone.
	b.WriteString("DELETE FROM " + s.table["fenced_grants"] + " WHERE role_name = @role;")
	for i := range prefixes {
		fmt.Fprintf(&b, "\nINSERT INTO %s (role_name, prefix) VALUES (@role, @prefix%d);", s.table["fenced_grants"], i)
	}
	return b.String()
}
