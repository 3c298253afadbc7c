package mysql_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/mysql"
)

// newRole creates a MariaDB role, dropped when t ends, and returns its name.
func newRole(t *testing.T, admin *mysql.Driver) string {
	t.Helper()
	role := "fenced_group_" + strings.ToLower(rand.Text()[:12])
	adminExecAll(t, admin, "CREATE ROLE "+role)
	atCleanup(t, admin, "DROP ROLE IF EXISTS "+role)
	return role
}

// atCleanup runs q when t ends.
func atCleanup(t *testing.T, admin *mysql.Driver, q string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.DB().ExecContext(ctx, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	})
}

func adminExecAll(t *testing.T, admin *mysql.Driver, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := admin.DB().ExecContext(testCtx(t), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

func databaseName(t *testing.T, d *mysql.Driver) string {
	t.Helper()
	var db string
	if err := d.DB().QueryRowContext(testCtx(t), "SELECT DATABASE()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	return db
}

// wantGrantRefused: Grant refuses account, and its sentence says each of words.
func wantGrantRefused(t *testing.T, s *fenced.Store, account string, opts *fenced.GrantOptions, words ...string) {
	t.Helper()
	err := s.Grant(testCtx(t), account, opts)
	if err == nil {
		t.Fatalf("grant to %s succeeded, want a refusal saying %q", account, words)
	}
	t.Log(err)
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("grant to %s: %q does not say %q", account, err, w)
		}
	}
}

// TestGrantRefusesTemporaryTablesThroughRoles: CREATE TEMPORARY TABLES that comes to the
// account through a role (its default role, or a role granted to a role it may SET ROLE to)
// lets it shadow fenced's tables as well as its own grant does, so Grant refuses it.
func TestGrantRefusesTemporaryTablesThroughRoles(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	db := databaseName(t, owner)

	t.Run("default role", func(t *testing.T) {
		account, _ := newUser(t, owner, dbURL)
		group := newRole(t, owner)
		adminExecAll(t, owner,
			"GRANT CREATE TEMPORARY TABLES ON `"+db+"`.* TO "+group,
			"GRANT "+group+" TO '"+account+"'@'%'",
			"SET DEFAULT ROLE "+group+" FOR '"+account+"'@'%'")
		wantGrantRefused(t, ownerStore, account, nil, "temporary tables", group)
	})
	t.Run("role of a role", func(t *testing.T) {
		account, _ := newUser(t, owner, dbURL)
		outer, inner := newRole(t, owner), newRole(t, owner)
		adminExecAll(t, owner,
			"GRANT CREATE TEMPORARY TABLES ON *.* TO "+inner,
			"GRANT "+inner+" TO "+outer,
			"GRANT "+outer+" TO '"+account+"'@'%'")
		wantGrantRefused(t, ownerStore, account, nil, "temporary tables", inner)
	})
}

// TestGrantRefusesTemporaryTablesToPublic: a grant to PUBLIC (MariaDB 10.11) reaches every
// account.
func TestGrantRefusesTemporaryTablesToPublic(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	db := databaseName(t, owner)
	account, _ := newUser(t, owner, dbURL)
	if _, err := owner.DB().ExecContext(ctx, "GRANT CREATE TEMPORARY TABLES ON `"+db+"`.* TO PUBLIC"); err != nil {
		t.Skipf("the server has no PUBLIC to grant to: %v", err)
	}
	atCleanup(t, owner, "REVOKE CREATE TEMPORARY TABLES ON `"+db+"`.* FROM PUBLIC")
	wantGrantRefused(t, ownerStore, account, nil, "temporary tables", "PUBLIC")
}

// TestGrantRefusesWhatItCannotSee: an owner that is not the server's admin sees no other
// account's privileges (information_schema shows them only to a reader of the mysql database),
// so it cannot tell whether the account may create temporary tables: Grant refuses and says
// what the owner lacks. Given SELECT on the mysql database, the same owner's Grant checks, and
// grants once the account may not.
func TestGrantRefusesWhatItCannotSee(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	root := open(t, dbURL)
	newStore(t, root) // migrated by the server's admin
	db := databaseName(t, root)
	ownerName, ownerURL := newUser(t, root, dbURL)
	adminExecAll(t, root, "GRANT ALL ON `"+db+"`.* TO '"+ownerName+"'@'%' WITH GRANT OPTION")
	ownerStore := newStore(t, open(t, ownerURL))
	account, _ := newUser(t, root, dbURL)
	adminExecAll(t, root, "GRANT CREATE TEMPORARY TABLES ON `"+db+"`.* TO '"+account+"'@'%'")

	wantGrantRefused(t, ownerStore, account, nil, "cannot read the privileges of "+account, "SELECT on the mysql database")

	adminExecAll(t, root, "GRANT SELECT ON mysql.* TO '"+ownerName+"'@'%'")
	wantGrantRefused(t, ownerStore, account, nil, "temporary tables")
	adminExecAll(t, root, "REVOKE CREATE TEMPORARY TABLES ON `"+db+"`.* FROM '"+account+"'@'%'")
	if err := ownerStore.Grant(testCtx(t), account, nil); err != nil {
		t.Fatalf("grant by an owner that may read the privileges: %v", err)
	}
}

// TestGrantRefusesWriteRights: Grant only grants and revokes EXECUTE on the procedures, so an
// account that may write fenced's tables some other way (its own grant on the database or a
// table, a role, PUBLIC) would keep writing them without the fence, and one whose level
// excludes a procedure could still call it with EXECUTE on the database; SUPER or SET USER
// let it create a procedure that runs as the owner. Grant refuses each and names the right and
// where it comes from.
func TestGrantRefusesWriteRights(t *testing.T) {
	t.Parallel()
	dbURL := mysql.CreateTestDatabase(t)
	owner := open(t, dbURL)
	ownerStore := newStore(t, owner)
	db := databaseName(t, owner)
	reader := &fenced.GrantOptions{Access: fenced.AccessReader}

	for _, c := range []struct {
		name  string
		grant string // %s: the account
		opts  *fenced.GrantOptions
		words []string
	}{
		{"update on the database", "GRANT UPDATE ON `" + db + "`.* TO %s", nil, []string{"UPDATE", "`" + db + "`.*"}},
		{"delete everywhere", "GRANT DELETE ON *.* TO %s", nil, []string{"DELETE", "*.*"}},
		{"insert on a table", "GRANT INSERT ON `" + db + "`.fenced_meta TO %s", nil, []string{"INSERT", "fenced_meta"}},
		{"update on a column", "GRANT UPDATE (epoch) ON `" + db + "`.fenced_meta TO %s", nil, []string{"UPDATE", "fenced_meta"}},
		{"set user (a definer of its choice)", "GRANT SET USER ON *.* TO %s", nil, []string{"SET USER", "run as another account"}},
		{"super", "GRANT SUPER ON *.* TO %s", nil, []string{"SUPER", "run as another account"}},
		{"delete history", "GRANT DELETE HISTORY ON `" + db + "`.* TO %s", nil, []string{"can still DELETE HISTORY", "GRANT DELETE HISTORY"}},
		{"drop (truncate)", "GRANT DROP ON `" + db + "`.* TO %s", nil, []string{"DROP"}},
		{"execute for a reader", "GRANT EXECUTE ON `" + db + "`.* TO %s", reader, []string{"EXECUTE", "fenced_provision", "reader"}},
		// Grant revokes the account's own EXECUTE on a procedure its level excludes, not a role's.
		{"execute an admin's procedure", "GRANT EXECUTE ON PROCEDURE `" + db + "`.fenced_bump_epoch TO %s", nil, []string{"EXECUTE", "fenced_bump_epoch"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Granting a procedure needs it to exist: a first Grant to a clean account installs them.
			clean, _ := newUser(t, owner, dbURL)
			if err := ownerStore.Grant(testCtx(t), clean, nil); err != nil {
				t.Fatalf("grant to a clean account: %v", err)
			}
			for _, via := range []string{"own", "role", "PUBLIC"} {
				account, _ := newUser(t, owner, dbURL)
				grantee := "'" + account + "'@'%'"
				words := append([]string(nil), c.words...)
				switch via {
				case "role":
					group := newRole(t, owner)
					adminExecAll(t, owner, "GRANT "+group+" TO "+grantee)
					grantee, words = group, append(words, group)
				case "PUBLIC":
					if strings.Contains(c.grant, "*.*") {
						continue // a global grant to PUBLIC would reach the accounts of tests running beside
					}
					grantee, words = "PUBLIC", append(words, "PUBLIC")
					atCleanup(t, owner, strings.Replace(strings.Replace(c.grant, "GRANT", "REVOKE", 1), " TO %s", " FROM PUBLIC", 1))
				}
				adminExecAll(t, owner, strings.Replace(c.grant, "%s", grantee, 1))
				if via == "own" && strings.Contains(c.grant, "PROCEDURE") {
					if err := ownerStore.Grant(testCtx(t), account, c.opts); err != nil {
						t.Fatalf("grant to an account with its own EXECUTE on an excluded procedure: %v", err)
					}
					continue
				}
				wantGrantRefused(t, ownerStore, account, c.opts, words...)
			}
		})
	}
}
