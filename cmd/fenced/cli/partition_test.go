package cli_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// netnsRedis starts a redis-server (appendonly yes, appendfsync always) in a network namespace
// of the test's own (newNetnsLink), and returns its URL, the host side of the veth (for
// --partition-dev) and a --restart-cmd that crashes it (kill -9) and starts it again in the
// namespace. It skips (fails under CI=true) without root, ip or redis-server.
func netnsRedis(t *testing.T) (url, dev, restart string) {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "redis-server is not installed")
	}
	l := newNetnsLink(t)
	ip, ns, nsIP := l.ip, l.ns, l.addr
	dir := t.TempDir()
	conf, pid := filepath.Join(dir, "redis.conf"), filepath.Join(dir, "redis.pid")
	const port = 6399
	err = os.WriteFile(conf, []byte(fmt.Sprintf(`bind %s
port %d
protected-mode no
dir %s
appendonly yes
appendfsync always
save ""
daemonize yes
pidfile %s
logfile %s
`, nsIP, port, dir, pid, filepath.Join(dir, "redis.log"))), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	ipRun(t, ip, "netns", "exec", ns, server, conf)
	t.Cleanup(func() {
		if b, err := os.ReadFile(pid); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				if proc, err := os.FindProcess(p); err == nil {
					_ = proc.Kill()
				}
			}
		}
	})
	addr := net.JoinHostPort(nsIP, strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server in the namespace did not start")
		}
		time.Sleep(50 * time.Millisecond) // polling the server's state
	}
	restart = fmt.Sprintf(`p=$(cat %[1]s); kill -9 "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; %[2]s netns exec %[3]s %[4]s %[5]s`,
		pid, ip, ns, server, conf)
	return "redis://" + addr + "/0", l.dev, restart
}

// netnsServers are the servers the tests start in network namespaces of their own, each
// giving its URL and the host's end of its link.
var netnsServers = []struct {
	name  string
	start func(t *testing.T) (url, dev string)
}{
	{"redis", func(t *testing.T) (string, string) { url, dev, _ := netnsRedis(t); return url, dev }},
	{"postgres", netnsPostgres},
	{"mariadb", netnsMariaDB},
}

// netnsPostgres starts a PostgreSQL server of the test's own (initdb, then postgres as the
// postgres user, shared_buffers 16MB) in a network namespace of the test's own, and returns
// its URL and the host side of the veth to it. It skips (fails under CI=true) without root,
// ip or the server binaries.
func netnsPostgres(t *testing.T) (url, dev string) {
	t.Helper()
	url, dev, _ = netnsPostgresRestart(t)
	return url, dev
}

// netnsPostgresRestart is netnsPostgres with a --restart-cmd that crashes the server (kill -9
// of every process in its namespace: the postmaster and its backends at once) and starts it
// again from its data directory, which replays its WAL.
func netnsPostgresRestart(t *testing.T) (url, dev, restart string) {
	t.Helper()
	l := newNetnsLink(t) // first: its cleanup runs after the server's stop
	s := newPGServers(t)
	s.in, s.host = l.in(), l.addr
	p := s.primary("netns")
	hba, err := os.OpenFile(filepath.Join(p.data(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The workers connect from the host side of the link.
	if _, err := fmt.Fprintln(hba, "host all all 0.0.0.0/0 trust"); err != nil {
		t.Fatal(err)
	}
	if err := hba.Close(); err != nil {
		t.Fatal(err)
	}
	const options = "-c shared_buffers=16MB -c max_connections=200"
	p.startWith(options)
	start := append(append(append([]string{}, s.in...), s.as...), filepath.Join(s.bin, "pg_ctl"))
	return p.URL(), l.dev, l.crash() + "; " + shellJoin(append(start, p.startArgs(options)...))
}

// netnsMariaDB starts a MariaDB server of the test's own (startMariaDBIn) in a network
// namespace of the test's own, and returns its URL (a database of its own) and the host side
// of the veth to it.
func netnsMariaDB(t *testing.T) (url, dev string) {
	t.Helper()
	url, dev, _ = netnsMariaDBRestart(t)
	return url, dev
}

// netnsMariaDBRestart is netnsMariaDB with a --restart-cmd that crashes the server (kill -9 of
// mariadbd, the one process in its namespace) and starts it again, from its data directory,
// with the command line it was started with (read from /proc), which recovers InnoDB's log.
func netnsMariaDBRestart(t *testing.T) (url, dev, restart string) {
	t.Helper()
	l := newNetnsLink(t)
	port, root, _ := startMariaDBIn(t, l)
	mustExec(t, root, "CREATE DATABASE fenced_torture")
	pids := l.pids(t)
	if len(pids) != 1 {
		t.Fatalf("%d processes in the server's namespace %s, want mariadbd alone", len(pids), l.ns)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	argv := l.in(strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")...)
	// A server the restart started is no child of the test's: stopped here, before
	// startMariaDBIn's stop (which finds its own process gone) and the removal of its directory.
	t.Cleanup(func() { l.stopAll(t) })
	restart = l.crash() + "; " + shellJoin(argv) + " >/dev/null 2>&1 &"
	return fmt.Sprintf("mysql://root@%s/fenced_torture", net.JoinHostPort(l.addr, strconv.Itoa(port))), l.dev, restart
}

// linkUp reports whether the interface is up.
func linkUp(t *testing.T, dev string) bool {
	out, err := exec.Command("ip", "link", "show", "dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show %s: %v: %s", dev, err, out)
	}
	return bytes.Contains(out, []byte("state UP")) || bytes.Contains(out, []byte(",UP"))
}

// lossTables lists the loss fault's nftables tables left on this machine by the process pid.
func lossTables(t *testing.T, pid int) bool {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return bytes.Contains(out, []byte(fmt.Sprintf("fenced_torture_loss_%d\n", pid)))
}

// nftTool skips (fails under CI=true) without nft, which the loss fault needs.
func nftTool(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		skipOrFail(t, "nft (nftables) is not installed: the loss fault needs it")
	}
}

// TestTorturePartition runs each server that can be partitioned (Redis, PostgreSQL, MariaDB)
// in a network namespace of the test's own, and the workers, in this one, reach it through a
// veth pair: the partition fault sets the link down and up again, the loss fault drops a
// share of its frames at random, each way, while the workers keep running. The checker must
// find nothing, every fault must have been injected (the loss fault with frames dropped), the
// link must be up and the loss rule gone afterwards, and the timeline must show them.
func TestTorturePartition(t *testing.T) {
	t.Parallel()
	for _, s := range netnsServers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			nftTool(t)
			url, dev := s.start(t)
			report := t.TempDir()
			code, out := runTortureIn(t, report, url, "--duration", "12s", "--faults", "partition,loss,drop-reply", "--partition-dev", dev)
			if code != 0 || !strings.Contains(out, "RESULT: no violations found") {
				t.Fatalf("partitioned torture: exit %d, want 0 and no violations", code)
			}
			checkTortured(t, out, "partition", "loss")
			if !linkUp(t, dev) {
				t.Fatalf("%s is left down after the run", dev)
			}
			nem, err := os.ReadFile(filepath.Join(report, "history", "nemesis.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`"detail":"loss \d+%: [^"]*, (\d+) dropped"`).FindAllSubmatch(nem, -1) {
				if string(m[1]) == "0" {
					t.Errorf("a loss fault dropped no frame: %s", m[0])
				}
			}
			if !regexp.MustCompile(`"detail":"loss \d+%: `).Match(nem) {
				t.Errorf("no loss fault recorded:\n%s", nem)
			}
			page, err := os.ReadFile(filepath.Join(report, "index.html"))
			if err != nil {
				t.Fatal(err)
			}
			for _, label := range []string{">partition</text>", ">loss "} {
				if !bytes.Contains(page, []byte(label)) {
					t.Errorf("the timeline shows no %q", label)
				}
			}
		})
	}
}

// TestTorturePartitionInterrupted interrupts a run (SIGINT, as Ctrl-C) in the middle of a
// partition, then of a loss fault: the link must be up again, the loss rule gone, and the
// report written.
func TestTorturePartitionInterrupted(t *testing.T) {
	t.Parallel()
	nftTool(t)
	url, dev, _ := netnsRedis(t)
	for _, fault := range []string{"partition", "loss"} {
		report := t.TempDir()
		cmd := exec.Command(bin, "torture", "--seed", tortureSeed, "--duration", "60s", "--report", report,
			"--faults", fault, "--partition-dev", dev)
		cmd.Env = append(os.Environ(), "FENCED_DB="+url)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The barrier: the link is down, or the loss rule is in place (the first fault comes
		// 1-2 s into the run).
		injected := func() bool { return !linkUp(t, dev) }
		if fault == "loss" {
			injected = func() bool { return lossTables(t, cmd.Process.Pid) }
		}
		for deadline := time.Now().Add(30 * time.Second); !injected(); {
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatalf("no %s within 30s:\n%s", fault, buf.String())
			}
			time.Sleep(20 * time.Millisecond) // polling for the barrier
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("interrupted during a %s:\n%s", fault, buf.String())
		if !linkUp(t, dev) {
			t.Errorf("%s is left down after the interruption", dev)
		}
		if lossTables(t, cmd.Process.Pid) {
			t.Errorf("the loss rule on %s is left in place after the interruption", dev)
		}
		if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(buf.String(), "report written") {
			t.Errorf("%s: exit %d, want 1 with the report written", fault, code)
		}
	}
}
