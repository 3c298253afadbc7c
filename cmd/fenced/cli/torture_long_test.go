//go:build torture

package cli_test

import (
	"bytes"
	"context"
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

// TestTortureEveryBackend is make torture: each backend for FENCED_TORTURE_TIME (default 7m)
// with every fault that applies to it, then the unfenced control and the restore control, and
// one line per backend. It is not part of make test (the build tag keeps it out).
// FENCED_TORTURE_RESTART=1 adds the restart fault for PostgreSQL and MariaDB, which restarts
// the shared server: only on a machine where nothing else uses it.
func TestTortureEveryBackend(t *testing.T) {
	d, err := time.ParseDuration(envOr("FENCED_TORTURE_TIME", "7m"))
	if err != nil {
		t.Fatalf("FENCED_TORTURE_TIME: %v", err)
	}
	restart := ""
	if os.Getenv("FENCED_TORTURE_RESTART") == "1" {
		restart = ",restart"
	}
	backends := []struct {
		name       string
		db         func(t *testing.T) (url string, extra []string)
		faults     string
		noControls bool // --unfenced and restore are not implemented
	}{
		{"sqlite", func(*testing.T) (string, []string) { return "", nil }, "pause,kill,drop-reply,clock,bump,restore", false},
		{"postgres", func(t *testing.T) (string, []string) { return postgresSchema(t), nil }, "pause,kill,drop-reply,rowlock,bump,restore,delay" + restart, false},
		{"mariadb", func(t *testing.T) (string, []string) { return mysqlDatabase(t), nil }, "pause,kill,drop-reply,rowlock,bump,restore,delay" + restart, false},
		{"redis", func(t *testing.T) (string, []string) {
			if os.Geteuid() != 0 {
				return ownRedis(t) // no network namespace: no partitions
			}
			url, dev, restart := netnsRedis(t)
			return url, []string{"--restart-cmd", restart, "--partition-dev", dev,
				"--faults", "pause,kill,drop-reply,bump,restore,restart,partition,delay"}
		}, "pause,kill,drop-reply,bump,restore,restart,delay", false},
		{"etcd", ownEtcd, "pause,kill,drop-reply,bump,restart", true},
	}
	var lines []string
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url, extra := b.db(t)
			run := func(d time.Duration, args ...string) (int, string) {
				// Many workers on many resources: the throughput, with contention on each.
				args = append([]string{"torture", "--seed", "42", "--duration", d.String(), "--faults", b.faults,
					"--workers", "24", "--resources", "24", "--report", t.TempDir()}, append(extra, args...)...)
				return tortureCmd(t, url, args...)
			}
			code, out := run(d)
			line := fmt.Sprintf("%-8s fenced: %s", b.name, summary(out, code))
			if code != 0 {
				t.Errorf("%s fenced: exit %d\n%s", b.name, code, out)
			}
			if b.noControls {
				lines = append(lines, line+" | controls: --unfenced and restore not implemented")
				return
			}
			code, out = run(min(d, 30*time.Second), "--unfenced")
			line += " | unfenced: " + summary(out, code)
			if code != 7 {
				t.Errorf("%s unfenced: exit %d, want 7\n%s", b.name, code, out)
			}
			// The control's one fault is the restore (drop-reply is drawn by the workers, not
			// planned), so that the plan surely holds one.
			restoreOnly := []string{"--faults", "restore,drop-reply", "--restore-without-bump"}
			code, out = run(15*time.Second, restoreOnly...)
			line += " | restore without bump: " + summary(out, code)
			if code != 7 {
				t.Errorf("%s restore without bump: exit %d, want 7\n%s", b.name, code, out)
			}
			lines = append(lines, line)
		})
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Println("torture", l)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// tortureCmd runs fenced with db as FENCED_DB.
func tortureCmd(t *testing.T, db string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCED_DB=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if db != "" {
		cmd.Env = append(cmd.Env, "FENCED_DB="+db)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run fenced: %v\n%s", err, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// summary is a run's line: operations checked, faults injected, violations, checker time.
func summary(out string, code int) string {
	find := func(re string) string {
		if m := regexp.MustCompile(re).FindStringSubmatch(out); m != nil {
			return m[1]
		}
		return "?"
	}
	violations := "0 violations"
	if m := regexp.MustCompile(`RESULT: (\d+ violations) found`).FindStringSubmatch(out); m != nil {
		violations = m[1]
	}
	return fmt.Sprintf("%s ops checked, faults %s, %s, checker %s (exit %d)",
		find(`operations: (\d+) checked`), find(`faults injected: (.*)`), violations, find(`checker: (\S+)`), code)
}

// ownRedis starts a redis-server of the test's own (appendonly yes, appendfsync always, on a free
// loopback port, in a temporary directory) and returns its URL and the --restart-cmd that
// crashes it (kill -9) and starts it again from the same directory.
func ownRedis(t *testing.T) (string, []string) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "redis.conf")
	pid := filepath.Join(dir, "redis.pid")
	err = os.WriteFile(conf, []byte(fmt.Sprintf(`bind 127.0.0.1
port %d
dir %s
appendonly yes
appendfsync always
save ""
daemonize yes
pidfile %s
logfile %s
`, port, dir, pid, filepath.Join(dir, "redis.log"))), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, conf).CombinedOutput(); err != nil {
		t.Fatalf("start redis-server: %v: %s", err, out)
	}
	stop := func() {
		if b, err := os.ReadFile(pid); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				if proc, err := os.FindProcess(p); err == nil {
					_ = proc.Kill()
				}
			}
		}
	}
	t.Cleanup(stop)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not start")
		}
		time.Sleep(50 * time.Millisecond) // polling the server's state
	}
	restart := fmt.Sprintf(`p=$(cat %[1]s); kill -9 "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; %[2]s %[3]s`, pid, bin, conf)
	return "redis://" + addr + "/0", []string{"--restart-cmd", restart}
}

// ownEtcd starts a one-member etcd of the test's own (a temporary data directory, free loopback
// ports) and returns its URL and the --restart-cmd that kills it (kill -9) and starts it again
// from its data directory.
func ownEtcd(t *testing.T) (string, []string) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed")
	}
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", port()), fmt.Sprintf("http://127.0.0.1:%d", port())
	dir := t.TempDir()
	pid := filepath.Join(dir, "etcd.pid")
	start := filepath.Join(dir, "start.sh")
	script := fmt.Sprintf(`#!/bin/sh
%s --name m1 --data-dir %s/data --listen-client-urls %s --advertise-client-urls %s \
  --listen-peer-urls %s --initial-advertise-peer-urls %s --initial-cluster m1=%s >>%s/etcd.log 2>&1 &
echo $! > %s
`, bin, dir, client, client, peer, peer, peer, dir, pid)
	if err := os.WriteFile(start, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(start).CombinedOutput(); err != nil {
		t.Fatalf("start etcd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pid); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				if proc, err := os.FindProcess(p); err == nil {
					_ = proc.Kill()
				}
			}
		}
	})
	addr := strings.TrimPrefix(client, "http://")
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("etcd did not start")
		}
		time.Sleep(50 * time.Millisecond) // polling the server's state
	}
	restart := fmt.Sprintf(`p=$(cat %[1]s); kill -9 "$p"; while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; %[2]s`, pid, start)
	return "etcd://" + addr, []string{"--restart-cmd", restart}
}
