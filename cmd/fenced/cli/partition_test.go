package cli_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// netnsRedis starts a redis-server (appendonly yes, appendfsync always) in a network namespace
// of the test's own, reached from this one through a veth pair on a private /30, and returns
// its URL, the host side of the veth (for --partition-dev) and a --restart-cmd that crashes it
// (kill -9) and starts it again in the namespace. It skips without root, ip or redis-server.
func netnsRedis(t *testing.T) (url, dev, restart string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed")
	}
	id := strings.ToLower(rand.Text()[:6])
	ns, host, peer := "fenced-"+id, "fh"+id, "fn"+id
	// A /30 in 10.213.0.0/16 of the test's own choosing; two tests colliding would fail to add
	// the address, not share it.
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	sub := fmt.Sprintf("10.213.%d", b[0])
	hostIP, nsIP := sub+".1", sub+".2"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	run("link", "add", host, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = exec.Command(ip, "link", "del", host).Run() })
	run("link", "set", peer, "netns", ns)
	run("addr", "add", hostIP+"/30", "dev", host)
	run("link", "set", host, "up")
	run("netns", "exec", ns, "ip", "addr", "add", nsIP+"/30", "dev", peer)
	run("netns", "exec", ns, "ip", "link", "set", peer, "up")
	run("netns", "exec", ns, "ip", "link", "set", "lo", "up")

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
	run("netns", "exec", ns, server, conf)
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
	return "redis://" + addr + "/0", host, restart
}

// linkUp reports whether the interface is up.
func linkUp(t *testing.T, dev string) bool {
	out, err := exec.Command("ip", "link", "show", "dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show %s: %v: %s", dev, err, out)
	}
	return bytes.Contains(out, []byte("state UP")) || bytes.Contains(out, []byte(",UP"))
}

// TestTorturePartition cuts the network between the workers and a redis-server in a network
// namespace of the test's own, then interrupts a run in the middle of a partition: the link
// must be up again and the report written.
func TestTorturePartition(t *testing.T) {
	t.Parallel()
	url, dev, _ := netnsRedis(t)
	code, out := runTorture(t, url, "--duration", "12s", "--faults", "partition,drop-reply", "--partition-dev", dev)
	if code != 0 || !strings.Contains(out, "RESULT: no violations found") {
		t.Fatalf("partitioned torture: exit %d, want 0 and no violations", code)
	}
	checkTortured(t, out, "partition")
	if !linkUp(t, dev) {
		t.Fatalf("%s is left down after the run", dev)
	}

	report := t.TempDir()
	cmd := exec.Command(bin, "torture", "--seed", tortureSeed, "--duration", "60s", "--report", report,
		"--faults", "partition", "--partition-dev", dev)
	cmd.Env = append(os.Environ(), "FENCED_DB="+url)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The barrier: the link is down (the first partition comes 1-2 s into the run).
	for deadline := time.Now().Add(30 * time.Second); linkUp(t, dev); {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("no partition within 30s:\n%s", buf.String())
		}
		time.Sleep(20 * time.Millisecond) // polling for the barrier
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	t.Logf("interrupted during a partition:\n%s", buf.String())
	if !linkUp(t, dev) {
		t.Errorf("%s is left down after the interruption", dev)
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(buf.String(), "report written") {
		t.Errorf("exit %d, want 1 with the report written", code)
	}
}
