package mysql_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// grantedRole makes a test database, migrates it as the server's admin, creates a user with a
// password (dropped when t ends), grants it the procedures, and returns the admin's driver and
// a URL that connects as the user.
func grantedRole(t *testing.T) (admin *mysql.Driver, roleURL string) {
	t.Helper()
	admin, roleURL, _ = grantedRoleOn(t)
	return admin, roleURL
}

// grantedRoleOn is grantedRole that also returns the admin's URL of the database.
func grantedRoleOn(t *testing.T) (admin *mysql.Driver, roleURL, dbURL string) {
	t.Helper()
	dbURL = mysql.CreateTestDatabase(t)
	admin = open(t, dbURL)
	s := newStore(t, admin)
	role := "fenced_role_" + strings.ToLower(rand.Text()[:12])
	password := rand.Text()
	if _, err := admin.DB().ExecContext(testCtx(t), "CREATE USER '"+role+"'@'%' IDENTIFIED BY '"+password+"'"); err != nil {
		t.Fatalf("create user: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.DB().ExecContext(ctx, "DROP USER IF EXISTS '"+role+"'@'%'"); err != nil {
			t.Errorf("drop user %s: %v", role, err)
		}
	})
	if err := s.Grant(testCtx(t), role, adminGrant); err != nil {
		t.Fatalf("grant: %v", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return admin, u.String(), dbURL
}

// newGrantedTarget runs the suite connected as a role that may only call the procedures.
func newGrantedTarget(t *testing.T) drivertest.Target {
	admin, roleURL, dbURL := grantedRoleOn(t)
	return drivertest.Target{
		Open: func(t *testing.T) driver.Driver { return open(t, roleURL) },
		Expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, expireSQL, resource)
			return err
		},
		LostReply: func(t *testing.T) (driver.Driver, func()) {
			proxy := drivertest.StartProxy(t, hostPort(t, roleURL))
			return open(t, withHost(t, roleURL, proxy.Addr())), proxy.LoseNextReply
		},
		Unreachable: func(t *testing.T) driver.Driver {
			return open(t, withHost(t, roleURL, drivertest.ClosedAddr(t)))
		},
		// The role cannot create the schema: after the loss the admin migrates and grants again,
		// as an operator would, and the role's store starts from what that created.
		LoseEverything: func(ctx context.Context) error {
			if err := mysql.RecreateTestDatabase(ctx, dbURL); err != nil {
				return err
			}
			u, err := url.Parse(roleURL)
			if err != nil {
				return err
			}
			return newStore(t, open(t, dbURL)).Grant(ctx, u.User.Username(), adminGrant)
		},
		SetEpoch:    setEpochWith(admin),
		HoldRowLock: holdRowLock(admin.DB()),
	}
}

func TestConformanceGrantedRole(t *testing.T) { drivertest.Run(t, newGrantedTarget) }

// TestGrantedRoleCannotBypassTheFence: connected as the role, every direct write to fenced's
// tables is denied (1142), and so is reading them; the store works through the procedures.
func TestGrantedRoleCannotBypassTheFence(t *testing.T) {
	t.Parallel()
	admin, roleURL := grantedRole(t)
	if err := admin.Provision(testCtx(t), "r"); err != nil {
		t.Fatal(err)
	}
	role := open(t, roleURL)
	for _, stmt := range []string{
		`UPDATE fenced_resources SET payload = 'forged', published_generation = published_generation + 1`,
		`DELETE FROM fenced_resources`,
		`INSERT INTO fenced_resources (resource) VALUES ('x')`,
		`UPDATE fenced_meta SET epoch = 1`,
		`INSERT INTO fenced_operations (op_id, outcome, recorded_at) VALUES ('x', 'accepted', UTC_TIMESTAMP())`,
		`DELETE FROM fenced_operations`,
		`SELECT payload FROM fenced_resources`,
	} {
		_, err := role.DB().ExecContext(testCtx(t), stmt)
		var me *gomysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1142 {
			t.Errorf("%s as the role: %v, want error 1142 (command denied)", stmt, err)
		}
	}
	// The half of the publication that records an operation is not a procedure of its own.
	if _, err := role.DB().ExecContext(testCtx(t), "CALL fenced_record_accepted('x', 'r', 1, 1)"); err == nil {
		t.Error("the role could record an operation outside a publication")
	}

	s := newStore(t, role) // migrates: through the procedures, it only checks
	l, err := s.Acquire(testCtx(t), "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(testCtx(t), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.PublishAndRelease(testCtx(t), []byte("through the fence"), fenced.WithOpID("op-1")); err != nil {
		t.Fatal(err)
	}
	got, gen, err := s.Get(testCtx(t), "r")
	if err != nil || string(got) != "through the fence" || gen != l.Generation() {
		t.Fatalf("published %q at %d (%v)", got, gen, err)
	}
	warnings, err := s.CheckDurability(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings {
		if strings.Contains(w, "engine") {
			t.Fatalf("the role's durability check: %q", w)
		}
	}
}

// TestProceduresCountMatchedRows: inside a procedure, ROW_COUNT() follows the connection's
// clientFoundRows, and LAST_INSERT_ID(expr) comes back through it, which Acquire and Renew
// rely on when connected as a role.
func TestProceduresCountMatchedRows(t *testing.T) {
	t.Parallel()
	_, roleURL := grantedRole(t)
	role := open(t, roleURL)
	var matched, id int64
	if err := role.DB().QueryRowContext(testCtx(t), "CALL fenced_check_found_rows()").Scan(&matched, &id); err != nil {
		t.Fatal(err)
	}
	if matched != 1 {
		t.Fatalf("an UPDATE writing the stored value counted %d rows inside a procedure, want 1", matched)
	}
	if err := role.DB().QueryRowContext(testCtx(t), "CALL fenced_provision('r')").Scan(&matched, &id); err != nil {
		t.Fatal(err)
	}
	// Parameters come in the order the statement first names them (see sql.go).
	if err := role.DB().QueryRowContext(testCtx(t), "CALL fenced_acquire('o', 60000000, 'r')").Scan(&matched, &id); err != nil {
		t.Fatal(err)
	}
	if matched != 1 || id != 1 {
		t.Fatalf("acquire through the procedure: matched %d, generation %d; want 1, 1", matched, id)
	}
}
