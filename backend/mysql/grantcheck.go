package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/fenced-dev/fenced/driver"
)

// erDBAccessDenied: the account may not use a database (here, mysql).
const erDBAccessDenied = 1044

// fencedTables are the tables a granted account may not write but through the procedures.
var fencedTables = []string{"fenced_resources", "fenced_operations", "fenced_meta", "fenced_schema_migrations", "fenced_grants"}

// writeRights are the privileges that change a table's rows or the table itself without the
// procedures (TRUNCATE needs DROP); MariaDB's privilege tables spell them this way.
var writeRights = []string{"INSERT", "UPDATE", "DELETE", "DROP", "ALTER", "DELETE VERSIONING ROWS"}

// sqlAccountRights lists every grant that reaches the account ? ('name'@'%'): its own, those
// to PUBLIC, and those to every role granted to either, directly or through other roles (the
// account may SET ROLE to any of them, not only to its default role). Each row is the grantee
// (empty for the account itself), the level (global, db, table, column, procedure), the object
// (a database pattern, a table or a procedure) and the privileges, comma-separated. It reads
// MariaDB's privilege tables, not information_schema: information_schema shows another
// account's privileges only to a reader of the mysql database, lists a role's under the role
// and leaves out PUBLIC; reading the tables themselves fails when they are hidden, and Grant
// then refuses instead of seeing no privilege.
const sqlAccountRights = `WITH RECURSIVE g (u, h, via) AS (
    SELECT CAST(? AS CHAR(128)), CAST('%' AS CHAR(255)), CAST('' AS CHAR(128))
    UNION SELECT 'PUBLIC', '', 'PUBLIC'
    UNION SELECT m.Role, '', m.Role FROM mysql.roles_mapping m JOIN g ON m.User = g.u AND m.Host = g.h)
SELECT g.via, 'global', '', CONCAT_WS(',',
        IF(p.a & 2, 'Insert', NULL), IF(p.a & 4, 'Update', NULL), IF(p.a & 8, 'Delete', NULL),
        IF(p.a & 32, 'Drop', NULL), IF(p.a & 8192, 'Alter', NULL),
        IF(p.a & 65536, 'Create temporary tables', NULL), IF(p.a & 262144, 'Execute', NULL),
        IF(p.a & 536870912, 'Delete versioning rows', NULL), IF(p.a & 32768, 'Super', NULL),
        IF(p.a & 1073741824, 'Set user', NULL))
    FROM g JOIN (SELECT User, Host, CAST(JSON_VALUE(Priv, '$.access') AS UNSIGNED) AS a FROM mysql.global_priv) p
      ON p.User = g.u AND p.Host = g.h
UNION ALL
SELECT g.via, 'db', d.Db, CONCAT_WS(',',
        IF(d.Insert_priv = 'Y', 'Insert', NULL), IF(d.Update_priv = 'Y', 'Update', NULL),
        IF(d.Delete_priv = 'Y', 'Delete', NULL), IF(d.Drop_priv = 'Y', 'Drop', NULL),
        IF(d.Alter_priv = 'Y', 'Alter', NULL), IF(d.Create_tmp_table_priv = 'Y', 'Create temporary tables', NULL),
        IF(d.Execute_priv = 'Y', 'Execute', NULL), IF(d.Delete_history_priv = 'Y', 'Delete versioning rows', NULL))
    FROM g JOIN mysql.db d ON d.User = g.u AND d.Host = g.h WHERE ? LIKE d.Db
UNION ALL
SELECT g.via, 'table', t.Table_name, t.Table_priv
    FROM g JOIN mysql.tables_priv t ON t.User = g.u AND t.Host = g.h WHERE t.Db = ?
UNION ALL
SELECT g.via, 'column', c.Table_name, c.Column_priv
    FROM g JOIN mysql.columns_priv c ON c.User = g.u AND c.Host = g.h WHERE c.Db = ?
UNION ALL
SELECT g.via, 'procedure', r.Routine_name, r.Proc_priv
    FROM g JOIN mysql.procs_priv r ON r.User = g.u AND r.Host = g.h
    WHERE r.Db = ? AND r.Routine_type = 'PROCEDURE'`

// accountRight is one row of sqlAccountRights.
type accountRight struct {
	via, level, object string
	privs              []string // upper case
}

// grantText is the statement that gave the right, for the refusal to quote.
func (r accountRight) grantText(priv, schema, account string) string {
	on := "*.*"
	switch r.level {
	case "db":
		on = "`" + r.object + "`.*"
	case "table", "column":
		on = "`" + schema + "`." + r.object
	case "procedure":
		on = "PROCEDURE `" + schema + "`." + r.object
	}
	to := account
	switch {
	case r.via == "PUBLIC":
		to = "PUBLIC"
	case r.via != "":
		to = r.via + ", a role it holds"
	}
	return "GRANT " + privName(priv) + " ON " + on + " TO " + to
}

// privName is a privilege as GRANT spells it.
func privName(priv string) string {
	if priv == "DELETE VERSIONING ROWS" {
		return "DELETE HISTORY"
	}
	return priv
}

// checkAccountRights refuses an account that Grant's EXECUTE grants would not confine: one
// that may create temporary tables in schema (a temporary fenced_meta shadows the real one
// inside the procedures), name another account as the DEFINER of what it creates (SUPER or
// SET USER: a procedure or trigger of its own would run as the owner), write fenced's tables
// directly, or execute a procedure its level does not include (EXECUTE on a database or on
// every one cannot be revoked per procedure).
// The account's own grants on fenced's procedures are not counted: Grant revokes them.
func checkAccountRights(ctx context.Context, conn *sql.Conn, role, schema string, level driver.Access) error {
	account := "'" + role + "'@'%'"
	rows, err := conn.QueryContext(ctx, sqlAccountRights, role, schema, schema, schema, schema)
	if err != nil {
		switch serverError(err) {
		case erTableAccessDenied, erDBAccessDenied:
			return fmt.Errorf("cannot read the privileges of %s, so cannot tell whether it may create temporary tables "+
				"or write fenced's tables: grant needs SELECT on the mysql database, which the account running it lacks: %w", role, err)
		case erNoSuchTable:
			return fmt.Errorf("cannot read the privileges of %s: this server has no MariaDB privilege tables "+
				"(mysql.global_priv, mysql.roles_mapping), which grant reads to check them: %w", role, err)
		}
		return fmt.Errorf("read the privileges of %s: %w", role, err)
	}
	defer rows.Close()
	var rights []accountRight
	for rows.Next() {
		var r accountRight
		var privs string
		if err := rows.Scan(&r.via, &r.level, &r.object, &privs); err != nil {
			return fmt.Errorf("read the privileges of %s: %w", role, err)
		}
		for p := range strings.SplitSeq(privs, ",") {
			if p != "" {
				r.privs = append(r.privs, strings.ToUpper(p))
			}
		}
		rights = append(rights, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the privileges of %s: %w", role, err)
	}
	excluded := "" // the first procedure the level does not include
	for _, s := range procedureStmts {
		if need, _ := access(s); !level.Includes(need) {
			excluded = "fenced_" + s.name
			break
		}
	}
	// Temporary tables first, then a definer of its choice, then writes, then EXECUTE: the
	// refusal names the worst.
	for _, r := range rights {
		if (r.level == "global" || r.level == "db") && slices.Contains(r.privs, "CREATE TEMPORARY TABLES") {
			return fmt.Errorf("role %s may create temporary tables in %s through %s, with which it could shadow "+
				"fenced's tables inside the procedures; revoke it first",
				role, schema, r.grantText("CREATE TEMPORARY TABLES", schema, account))
		}
	}
	for _, r := range rights {
		for _, p := range []string{"SUPER", "SET USER"} {
			if r.level == "global" && slices.Contains(r.privs, p) {
				return fmt.Errorf("role %s can still create procedures, triggers and views that run as another account, "+
					"the owner of fenced's tables too, through %s; revoke it first", role, r.grantText(p, schema, account))
			}
		}
	}
	for _, r := range rights {
		if (r.level == "table" || r.level == "column") && !slices.Contains(fencedTables, r.object) {
			continue
		}
		for _, p := range writeRights {
			if slices.Contains(r.privs, p) {
				return fmt.Errorf("role %s can still %s fenced's tables directly, without the fence, through %s; revoke it first",
					role, privName(p), r.grantText(p, schema, account))
			}
		}
	}
	for _, r := range rights {
		if !slices.Contains(r.privs, "EXECUTE") {
			continue
		}
		name := excluded
		if r.level == "procedure" {
			if need, ok := procedureAccess(r.object); r.via == "" || !ok || level.Includes(need) {
				continue
			}
			name = r.object
		}
		if name != "" {
			return fmt.Errorf("role %s can still EXECUTE %s, which its level (%s) does not include, through %s; revoke it first",
				role, name, level, r.grantText("EXECUTE", schema, account))
		}
	}
	return nil
}

// procedureAccess is the level fenced's procedure name needs.
func procedureAccess(name string) (driver.Access, bool) {
	for _, s := range procedureStmts {
		if strings.EqualFold("fenced_"+s.name, name) {
			need, _ := access(s)
			return need, true
		}
	}
	return 0, false
}
