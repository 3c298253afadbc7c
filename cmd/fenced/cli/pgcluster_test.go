package cli_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgServers starts PostgreSQL servers of the test's own, from the installed server binaries,
// in a temporary directory on loopback ports, so that a test can make a standby and promote
// it without touching the shared server. Everything it starts is stopped, and the directory
// removed, when the test ends.
type pgServers struct {
	t    *testing.T
	bin  string   // the directory holding initdb, pg_ctl, pg_basebackup
	as   []string // prefix that runs a binary as a non-root user (initdb and postgres refuse root)
	in   []string // prefix that runs a binary in a network namespace (netnsPostgres), or none
	host string   // the address the servers listen on and the URLs name
	dir  string
	uid  int
	gid  int
	runs []string // data directories started, to stop at the end
}

// newPGServers finds the server binaries ($FENCED_TEST_PGBIN, else the newest
// /usr/lib/postgresql/*/bin). Without them the test skips loudly, or fails under CI=true.
func newPGServers(t *testing.T) *pgServers {
	t.Helper()
	bin := os.Getenv("FENCED_TEST_PGBIN")
	if bin == "" {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		sort.Slice(found, func(i, j int) bool { return pgMajor(found[i]) < pgMajor(found[j]) })
		if len(found) > 0 {
			bin = filepath.Dir(found[len(found)-1])
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_basebackup")); bin == "" || err != nil {
		msg := "!!! no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) under /usr/lib/postgresql/*/bin; " +
			"set FENCED_TEST_PGBIN to run the standby tests"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := &pgServers{t: t, bin: bin, uid: -1, gid: -1, host: "127.0.0.1"}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, and initdb refuses root: no user postgres to run it as: %v", err)
		}
		s.uid, _ = strconv.Atoi(u.Uid)
		s.gid, _ = strconv.Atoi(u.Gid)
		s.as = []string{"runuser", "-u", "postgres", "--"}
	}
	// Not t.TempDir: its parent is private to root, and the servers run as postgres.
	dir, err := os.MkdirTemp("", "fenced-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	if s.uid >= 0 {
		if err := os.Chown(dir, s.uid, s.gid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(s.cleanup)
	return s
}

func pgMajor(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

// exec runs one of the server binaries and fails the test if it fails.
func (s *pgServers) exec(name string, args ...string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	argv := append(append(append(append([]string{}, s.in...), s.as...), filepath.Join(s.bin, name)), args...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, s.logs())
	}
}

// pgServer is one server: its data directory and port.
type pgServer struct {
	s    *pgServers
	name string
	port int
}

func (p pgServer) data() string { return filepath.Join(p.s.dir, p.name) }

// URL is the server's address for pgx and for the fenced command.
func (p pgServer) URL() string {
	return fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=disable", p.s.host, p.port)
}

// primary creates a new cluster with initdb.
func (s *pgServers) primary(name string) pgServer {
	p := pgServer{s: s, name: name, port: freePort(s.t)}
	s.exec("initdb", "-D", p.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
	return p
}

// standby copies from's running cluster with pg_basebackup -R: it starts as a hot standby
// streaming from it.
func (s *pgServers) standby(name string, from pgServer) pgServer {
	p := pgServer{s: s, name: name, port: freePort(s.t)}
	s.exec("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(from.port), "-U", "postgres",
		"-D", p.data(), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
	return p
}

func (p pgServer) start() { p.s.t.Helper(); p.startWith("") }

// startWith starts the server with more server options (-c name=value ...).
func (p pgServer) startWith(options string) {
	p.s.t.Helper()
	p.s.runs = append(p.s.runs, p.data())
	p.s.exec("pg_ctl", p.startArgs(options)...)
}

// startArgs are pg_ctl's arguments that start the server.
func (p pgServer) startArgs(options string) []string {
	return []string{"-D", p.data(), "-l", p.data() + ".log", "-w", "-t", "60", "start", "-o",
		fmt.Sprintf("-p %d -c listen_addresses=%s -c unix_socket_directories=%s %s", p.port, p.s.host, p.s.dir, options)}
}

func (p pgServer) stop() {
	p.s.t.Helper()
	p.s.exec("pg_ctl", "-D", p.data(), "-w", "-t", "60", "-m", "fast", "stop")
}

func (p pgServer) promote() {
	p.s.t.Helper()
	p.s.exec("pg_ctl", "-D", p.data(), "-w", "-t", "60", "promote")
}

// exec runs a statement.
func (p pgServer) exec(q string) {
	p.s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.s.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, q); err != nil {
		p.s.t.Fatalf("%s: %v", q, err)
	}
}

// query runs a query returning one row.
func (p pgServer) query(q string, dest ...any) {
	p.s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.s.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, q).Scan(dest...); err != nil {
		p.s.t.Fatalf("%s: %v", q, err)
	}
}

// caughtUp waits until the standby has replayed everything the primary wrote so far.
func (p pgServer) caughtUp(primary pgServer) {
	p.s.t.Helper()
	var target string
	primary.query(`SELECT pg_current_wal_lsn()::text`, &target)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var done bool
		p.query(`SELECT coalesce(pg_last_wal_replay_lsn() >= '`+target+`'::pg_lsn, false)`, &done)
		if done {
			return
		}
		if time.Now().After(deadline) {
			p.s.t.Fatalf("the standby has not replayed up to %s after 30s%s", target, p.s.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the standby's replay position, not hoping for an order
	}
}

// logs returns the servers' logs, for a failure message.
func (s *pgServers) logs() string {
	var b strings.Builder
	for _, d := range s.runs {
		if out, err := os.ReadFile(d + ".log"); err == nil {
			fmt.Fprintf(&b, "\n--- %s.log\n%s", filepath.Base(d), out)
		}
	}
	return b.String()
}

// cleanup stops every server this test started, whatever state it is in, and removes the
// directory.
func (s *pgServers) cleanup() {
	for _, d := range s.runs {
		if _, err := os.Stat(filepath.Join(d, "postmaster.pid")); err != nil {
			continue // stopped already
		}
		argv := append(append([]string{}, s.as...), filepath.Join(s.bin, "pg_ctl"), "-D", d, "-w", "-t", "60", "-m", "immediate", "stop")
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			s.t.Errorf("stop the server in %s: %v\n%s", d, err, out)
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		s.t.Errorf("remove %s: %v", s.dir, err)
	}
}

// freePort returns a loopback port that nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
