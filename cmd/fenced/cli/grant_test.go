package cli_test

import (
	"context"
	"crypto/rand"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/cmd/fenced/cli"
)

// TestGrantLevelsCLI: "fenced grant --as" on PostgreSQL and MariaDB, after an epoch bump. A
// worker acquires and cannot bump, prune or provision (exit 8, one sentence naming the role
// and the operation); granted again as reader it cannot acquire; as admin it bumps; limited
// to a prefix it cannot acquire outside it. The output and every error leave the role's
// password out.
func TestGrantLevelsCLI(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			var owner target
			var role, roleURL, password string
			switch engine {
			case "postgres":
				owner = target{t: t, url: postgresSchema(t), dir: t.TempDir()}
				role = "fenced_cli_role_" + strings.ToLower(rand.Text()[:12])
				pgExec(t, owner.url, "CREATE ROLE "+role+" LOGIN")
				t.Cleanup(func() {
					pgExec(t, owner.url, "DROP OWNED BY "+role)
					pgExec(t, owner.url, "DROP ROLE "+role)
				})
				roleURL = withUser(t, owner.url, url.User(role))
			case "mysql":
				owner = target{t: t, url: mysqlDatabase(t), dir: t.TempDir()}
				role = "fenced_cli_role_" + strings.ToLower(rand.Text()[:12])
				password = "Pw-" + rand.Text()
				mysqlExec(t, owner.url, "CREATE USER '"+role+"'@'%' IDENTIFIED BY '"+password+"'")
				t.Cleanup(func() { mysqlExec(t, owner.url, "DROP USER IF EXISTS '"+role+"'@'%'") })
				roleURL = withUser(t, owner.url, url.UserPassword(role, password))
			}
			owner.ok(nil, "migrate")
			owner.ok(nil, "epoch", "bump")
			owner.ok(nil, "provision", "team a/ü x", "b/x")
			if msg := owner.fails(2, nil, "grant", "--role", role, "--as", "boss"); !strings.Contains(msg, `"boss" is not a level`) {
				t.Fatalf("grant --as boss: %q", msg)
			}
			if out := string(owner.ok(nil, "grant", "--role", role)); out != `{"as":"worker","granted":"`+role+`"}`+"\n" {
				t.Fatalf("grant printed %q", out)
			}
			w := target{t: t, url: roleURL, dir: owner.dir}
			l := w.acquire("team a/ü x", "1m")
			if l.Epoch == l.Generation {
				t.Fatal("epoch equals generation")
			}
			w.ok(nil, "release", "team a/ü x", "--owner", l.Owner, "--token", l.Token)
			for _, c := range []struct {
				args []string
				op   string
			}{
				{[]string{"epoch", "bump"}, "bump the epoch"},
				{[]string{"prune", "--older-than", "8808h"}, "prune"},
				{[]string{"provision", "new"}, "provision"},
			} {
				msg := w.fails(cli.ExitDenied, nil, c.args...)
				if !strings.Contains(msg, "role "+role) || !strings.Contains(msg, c.op) {
					t.Errorf("%v as a worker: %q does not name the role and %q", c.args, msg, c.op)
				}
				if password != "" && strings.Contains(msg, password) {
					t.Errorf("%v printed the password: %q", c.args, msg)
				}
			}
			before := owner.show("b/x")

			owner.ok(nil, "grant", "--role", role, "--as", "reader")
			w.show("team a/ü x")
			if out := string(w.ok(nil, "resolve", "--read-only", "no-such-op")); out != `{"op_id":"no-such-op","outcome":"unknown"}`+"\n" {
				t.Errorf("resolve --read-only as a reader: %q", out)
			}
			if msg := w.fails(cli.ExitDenied, nil, "resolve", "no-such-op"); !strings.Contains(msg, "resolve") {
				t.Errorf("resolve as a reader: %q", msg)
			}
			if out := string(owner.ok(nil, "resolve", "--read-only", "no-such-op")); !strings.Contains(out, `"unknown"`) {
				t.Errorf("a refused resolve recorded the id: %q", out)
			}
			if msg := w.fails(cli.ExitDenied, nil, "acquire", "b/x", "--ttl", "1m"); !strings.Contains(msg, "may not acquire") {
				t.Errorf("acquire as a reader: %q", msg)
			}

			owner.ok(nil, "grant", "--role", role, "--as", "worker", "--prefix", "team a/")
			w.acquire("team a/ü x", "1m")
			if msg := w.fails(cli.ExitDenied, nil, "acquire", "b/x", "--ttl", "1m"); !strings.Contains(msg, "outside the prefixes") {
				t.Errorf("acquire outside the prefix: %q", msg)
			}
			if after := owner.show("b/x"); after.Generation != before.Generation || after.Owner != nil {
				t.Fatalf("a refused acquisition changed b/x: %+v -> %+v", before, after)
			}

			owner.ok(nil, "grant", "--role", role, "--as", "admin")
			w.ok(nil, "epoch", "bump")
		})
	}
}

// TestURLSecretsNeverPrinted: a wrong password, and URLs too malformed to open, fail with a
// sentence that does not contain the password, whichever backend's parser or client wrote it
// (TestRedact shows the command's last line of defence on a message that does).
func TestURLSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "S3cr3t-Pw%21x"
	decoded := "S3cr3t-Pw!x"
	for _, db := range []string{
		"postgres://u:" + secret + "@127.0.0.1:notaport/db",
		"mysql://u:" + secret + "@127.0.0.1:notaport/db",
		"redis://u:" + secret + "@127.0.0.1:notaport/0",
		"etcd://u:" + secret + "@/",
		"etcds://u:" + secret + "@127.0.0.1:1/?ca=/nonexistent/ca.pem",
		"sqlserver://u:" + secret + "@127.0.0.1:notaport?database=x",
		"mysql://root:" + secret + "@127.0.0.1:3306/db",
		"redis://127.0.0.1:1/0?password=" + secret,
	} {
		r := runIn(t, t.TempDir(), db, nil, "show", "x")
		if r.code == 0 || strings.Contains(r.stderr, secret) || strings.Contains(r.stderr, decoded) {
			t.Errorf("%s: exit %d, stderr %q", strings.SplitN(db, ":", 2)[0], r.code, r.stderr)
		}
		checkSentence(t, r.stderr)
	}
}

func withUser(t *testing.T, rawURL string, user *url.Userinfo) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = user
	return u.String()
}

func mysqlExec(t *testing.T, rawURL, stmt string) {
	t.Helper()
	d, err := mysql.Open(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.DB().ExecContext(ctx, stmt); err != nil {
		t.Errorf("%s: %v", stmt, err)
	}
}

// TestGrantRefusesUnconfinedRoleCLI: "fenced grant" to a role that could still write fenced's
// tables another way (PostgreSQL: pg_write_all_data; MariaDB: UPDATE on the database) fails
// with one sentence naming the right and where it comes from, and the exit code of grant's
// other refusals (1, as for an account that may create temporary tables or does not exist).
func TestGrantRefusesUnconfinedRoleCLI(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			var owner target
			role := "fenced_cli_role_" + strings.ToLower(rand.Text()[:12])
			var source string
			switch engine {
			case "postgres":
				owner = target{t: t, url: postgresSchema(t), dir: t.TempDir()}
				pgExec(t, owner.url, "CREATE ROLE "+role+" LOGIN")
				t.Cleanup(func() {
					pgExec(t, owner.url, "DROP OWNED BY "+role) // what a grant that was not refused gave
					pgExec(t, owner.url, "DROP ROLE "+role)
				})
				pgExec(t, owner.url, "GRANT pg_write_all_data TO "+role)
				source = "pg_write_all_data"
			case "mysql":
				owner = target{t: t, url: mysqlDatabase(t), dir: t.TempDir()}
				mysqlExec(t, owner.url, "CREATE USER '"+role+"'@'%'")
				t.Cleanup(func() { mysqlExec(t, owner.url, "DROP USER IF EXISTS '"+role+"'@'%'") })
				u, err := url.Parse(owner.url)
				if err != nil {
					t.Fatal(err)
				}
				source = "ON `" + strings.TrimPrefix(u.Path, "/") + "`.*"
				mysqlExec(t, owner.url, "GRANT UPDATE "+source+" TO '"+role+"'@'%'")
			}
			owner.ok(nil, "migrate")
			msg := owner.fails(cli.ExitOperational, nil, "grant", "--role", role)
			if !strings.Contains(msg, "role "+role+" can still ") || !strings.Contains(msg, source) {
				t.Errorf("grant to a role that may write the tables: %q does not name the right and %q", msg, source)
			}
		})
	}
}
