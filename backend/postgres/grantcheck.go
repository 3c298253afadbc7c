package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/driver"
)

// sqlTableRights lists, for each of fenced's tables ($2) and each right that writes it without
// the routines (a trigger of the role's would run inside them, as the owner), every role whose
// rights the role $1 has or may take with SET ROLE (itself included) that holds the right,
// counting column grants, memberships and predefined roles such as pg_write_all_data.
const sqlTableRights = `SELECT t.name, p.priv, m.rolname::text
FROM unnest($2::text[]) WITH ORDINALITY AS t(name, i)
CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER']) WITH ORDINALITY AS p(priv, j)
CROSS JOIN pg_roles m
WHERE pg_has_role($1::name, m.oid, 'MEMBER')
  AND CASE WHEN p.priv IN ('INSERT', 'UPDATE') THEN has_any_column_privilege(m.oid, t.name, p.priv)
           ELSE has_table_privilege(m.oid, t.name, p.priv) END
ORDER BY t.i, p.j, m.rolname`

// sqlRoutineRights is sqlTableRights for EXECUTE on the routines ($2, signatures).
const sqlRoutineRights = `SELECT f.sig, 'EXECUTE', m.rolname::text
FROM unnest($2::text[]) WITH ORDINALITY AS f(sig, i)
CROSS JOIN pg_roles m
WHERE pg_has_role($1::name, m.oid, 'MEMBER') AND has_function_privilege(m.oid, f.sig, 'EXECUTE')
ORDER BY f.i, m.rolname`

// checkConfined refuses a role that Grant's revocations did not confine: its own rights and
// PUBLIC's are gone, but a membership may still let it write fenced's tables (and a store
// connected as it would then send bare statements) or execute a routine its level excludes.
// A superuser is refused, and so is a role with CREATEROLE. It runs inside Grant's
// transaction, after the revocations, so a refusal changes nothing.
func checkConfined(ctx context.Context, tx pgx.Tx, role string, level driver.Access) error {
	var super, createRole bool
	if err := tx.QueryRow(ctx, `SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = $1`, role).Scan(&super, &createRole); err != nil {
		return fmt.Errorf("read the attributes of role %s: %w", role, classify(err))
	}
	if super {
		return fmt.Errorf("role %s is a superuser, which may write fenced's tables whatever it is granted; grant a role that is not", role)
	}
	if createRole {
		// Before PostgreSQL 16 CREATEROLE may grant itself any role but a superuser, the owner too.
		return fmt.Errorf("role %s has CREATEROLE, with which it can make itself a member of the owner of fenced's tables; "+
			"grant a role without it", role)
	}
	var excluded []string
	for _, rt := range routines {
		if rt.granted && !level.Includes(rt.access) {
			excluded = append(excluded, rt.signature())
		}
	}
	for _, check := range []struct {
		q       string
		objects []string
		what    string
	}{
		{sqlTableRights, fencedTables, ", without the fence,"},
		{sqlRoutineRights, excluded, ", which its level (" + level.String() + ") does not include,"},
	} {
		object, right, via, err := firstRight(ctx, tx, check.q, role, check.objects)
		if err != nil {
			return err
		}
		if object == "" {
			continue
		}
		object, _, _ = strings.Cut(object, "(")
		if len(via) == 0 {
			return fmt.Errorf("role %s can still %s %s%s as its owner; grant a role that does not own fenced's tables and routines",
				role, right, object, check.what)
		}
		return fmt.Errorf("role %s can still %s %s%s through its membership in %s; revoke it first",
			role, right, object, check.what, strings.Join(via, ", "))
	}
	return nil
}

// firstRight runs q and returns the first object and right the role holds, with the other
// roles it holds them through (none: the role itself).
func firstRight(ctx context.Context, tx pgx.Tx, q, role string, objects []string) (object, right string, via []string, err error) {
	rows, err := tx.Query(ctx, q, role, objects)
	if err != nil {
		return "", "", nil, fmt.Errorf("read the rights of role %s: %w", role, classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var o, r, holder string
		if err := rows.Scan(&o, &r, &holder); err != nil {
			return "", "", nil, fmt.Errorf("read the rights of role %s: %w", role, classify(err))
		}
		if object != "" && (o != object || r != right) {
			break
		}
		object, right = o, r
		if holder != role {
			via = append(via, holder)
		}
	}
	if err := rows.Err(); err != nil {
		return "", "", nil, fmt.Errorf("read the rights of role %s: %w", role, classify(err))
	}
	return object, right, via, nil
}
