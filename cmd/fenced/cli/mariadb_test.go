package cli_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
)

// startMariaDB starts a MariaDB server of the test's own (mariadb-install-db, then mariadbd) on
// a loopback port in a temporary directory, which the test may reconfigure (read_only) without
// touching the shared server, and returns a handle on it as root. The server is stopped and
// the directory removed when the test ends. extra are more server options (--name=value).
func startMariaDB(t *testing.T, extra ...string) (port int, root *sql.DB) {
	t.Helper()
	port, root, _ = startMariaDBIn(t, netnsLink{}, extra...)
	return port, root
}

// startMariaDBIn is startMariaDB in the network namespace of l when l names one: the server
// listens on the namespace's address, root may also connect from elsewhere (root@'%', no
// password: the namespace is the test's own), and the handle reaches it through its Unix
// socket. dsn is root's go-sql-driver address over TCP.
func startMariaDBIn(t *testing.T, l netnsLink, extra ...string) (port int, root *sql.DB, dsn string) {
	t.Helper()
	install, err1 := exec.LookPath("mariadb-install-db")
	server, err2 := exec.LookPath("mariadbd")
	if err2 != nil {
		server, err2 = "/usr/sbin/mariadbd", nil
		if _, err := os.Stat(server); err != nil {
			err2 = err
		}
	}
	if err1 != nil || err2 != nil {
		msg := "!!! no MariaDB server binaries (mariadb-install-db, mariadbd); install mariadb-server to run the read-only replica test"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "fenced-mariadb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	// mariadbd refuses to run as root: run it, and the installer, as mysql.
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			t.Fatalf("running as root, and mariadbd refuses root: no user mysql to run it as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}

	port, host, sock := freePort(t), "127.0.0.1", filepath.Join(dir, "sock")
	if l.ns != "" {
		host = l.addr
	}
	logFile := filepath.Join(dir, "error.log")
	argv := []string{server, "--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=" + host, "--socket=" + sock, "--pid-file=" + filepath.Join(dir, "pid"),
		"--skip-log-bin", "--innodb-buffer-pool-size=16M", "--log-error=" + logFile}
	if l.ns != "" {
		// ip netns exec needs root: mariadbd, started as root, becomes mysql itself.
		argv = append(l.in(argv...), "--user=mysql")
	}
	srv := exec.Command(argv[0], append(argv[1:], extra...)...)
	if l.ns == "" {
		srv.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }() // a SIGTERM exit is the expected end
	t.Cleanup(func() {                            // registered after the directory's removal, so it runs before it
		_ = srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
			t.Errorf("mariadbd did not stop within 30s of SIGTERM")
		}
	})

	dsn = fmt.Sprintf("root@tcp(%s:%d)/", host, port)
	admin := dsn
	if l.ns != "" {
		admin = "root@unix(" + sock + ")/"
	}
	root, err = sql.Open("mysql", admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	deadline := time.Now().Add(60 * time.Second)
	for root.PingContext(ctx) != nil {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logFile)
			t.Fatalf("mariadbd exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("mariadbd did not answer within 60s\n%s", log)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the server to listen
	}
	if l.ns != "" {
		mustExec(t, root, "CREATE USER 'root'@'%'", "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
	}
	return port, root, dsn
}

func mustExec(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// TestMariaDBReadOnlyReplica: on a MariaDB server set read_only, as a user without SUPER (who
// would bypass it), reads work through the command, every write fails with one sentence, and
// a schema that needs migrating is refused there, saying why.
func TestMariaDBReadOnlyReplica(t *testing.T) {
	t.Parallel()
	port, root := startMariaDB(t)
	mustExec(t, root,
		"CREATE DATABASE fenced_ro", "CREATE DATABASE fenced_unmigrated",
		"CREATE USER 'fenced'@'%'",
		"GRANT ALL ON fenced_ro.* TO 'fenced'@'%'", "GRANT ALL ON fenced_unmigrated.* TO 'fenced'@'%'")
	tg := target{t: t, url: fmt.Sprintf("mysql://fenced@127.0.0.1:%d/fenced_ro", port), dir: t.TempDir()}

	const res = "rép lica 1"
	tg.ok(nil, "migrate")
	tg.ok(nil, "epoch", "bump")
	epoch := decode[struct{ Epoch int64 }](t, tg.ok(nil, "epoch", "bump")).Epoch
	tg.ok(nil, "provision", res)
	payload := []byte("first\x00result\x00")
	first := tg.acquire(res, "1m")
	tg.ok(payload, append(leaseArgs("publish", res, first, "--epoch", strconv.FormatInt(first.Epoch, 10)), "--release")...)
	holder := tg.acquire(res, "10m")
	if holder.Epoch != epoch || holder.Generation == epoch {
		t.Fatalf("holder %+v: want epoch %d and a generation that differs from it", holder, epoch)
	}
	want := tg.show(res)

	mustExec(t, root, "SET GLOBAL read_only = ON")
	got := tg.show(res)
	if got.Generation != want.Generation || got.Epoch != want.Epoch || got.Owner == nil || *got.Owner != holder.Owner {
		t.Errorf("show on the read-only server: %+v, want %+v", got, want)
	}
	if out := tg.ok(nil, "get", res); !bytes.Equal(out, payload) {
		t.Errorf("get on the read-only server: %q, want %q", out, payload)
	}
	msg := target{t: t, url: fmt.Sprintf("mysql://fenced@127.0.0.1:%d/fenced_unmigrated", port), dir: t.TempDir()}.fails(1, nil, "show", res)
	if !strings.Contains(msg, "the schema needs migrating (it is at version 0") || !strings.Contains(msg, readOnlySentence) {
		t.Errorf("show on the read-only server in an unmigrated database: %q, want the schema and the read-only server named", msg)
	}
	for _, m := range everyCommand(t, tg, res, holder) {
		switch m.args[0] {
		case "show", "get", "migrate":
			if m.code != 0 {
				t.Errorf("fenced %s on the read-only server: exit %d, %q", m.cmd, m.code, m.stderr)
			}
		default:
			if m.code != 1 || !strings.Contains(m.stderr, readOnlySentence) {
				t.Errorf("fenced %s on the read-only server: exit %d, %q; want exit 1 and %q", m.cmd, m.code, m.stderr, readOnlySentence)
			}
		}
	}

	// Made writable again, as a promoted replica would be, the holder's lease is still good.
	mustExec(t, root, "SET GLOBAL read_only = OFF")
	tg.ok([]byte("second"), leaseArgs("publish", res, holder, "--epoch", strconv.FormatInt(holder.Epoch, 10))...)
}
