package cli_test

import (
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

// ownEtcd starts a one-member etcd of the test's own (a temporary data directory, free loopback
// ports) and returns its URL, the --restart-cmd that kills it (kill -9) and starts it again
// from its data directory, and the --restore-cmd that kills it, restores $FENCED_SNAPSHOT into
// a fresh data directory (etcdutl, or etcdctl where etcdutl is missing: etcd 3.4) and starts
// it from there. It skips without etcd (and fails under CI=true, where .ci/run installs it).
func ownEtcd(t *testing.T) (url, restart, restore string) {
	t.Helper()
	bin, tool := etcdTools(t)
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
	t.Cleanup(func() { killPidFile(pid) })
	addr := strings.TrimPrefix(client, "http://")
	waitListening(t, addr, 20*time.Second)
	restart = killExited(pid) + "; " + start
	restore = killExited(pid) + fmt.Sprintf(`; rm -rf %[1]s/restored && ETCDCTL_API=3 %[2]s snapshot restore "$FENCED_SNAPSHOT" --name m1 \
  --data-dir %[1]s/restored --initial-cluster m1=%[3]s --initial-advertise-peer-urls %[3]s >>%[1]s/restore.log 2>&1 && \
  rm -rf %[1]s/data && mv %[1]s/restored %[1]s/data && %[4]s`, dir, tool, peer, start)
	return "etcd://" + addr, restart, restore
}

// killExited is a shell command that kills (-9) the server whose pid the file pid holds and
// waits until it has exited: gone, or a zombie. An exited etcd has closed its ports and its data
// directory; waiting for it to be reaped too (kill -0) waited on init, which adopts the servers
// the start scripts leave behind and reaped them every 2 s or so on the machine measured
// (docs/TORTURE.md). The restore replaces the data directories it stops, so it kills too: a
// graceful stop of every member at once sometimes waited 7 s on a leadership transfer to a
// member stopping as well.
func killExited(pid string) string {
	return fmt.Sprintf(`p=$(cat %s); kill -9 "$p"; %s`, pid, awaitExit(`"$p"`))
}

// awaitExit is a shell loop that waits until the process p (a shell word) has exited: gone, or
// a zombie ("Z", the state after the command's name in /proc/PID/stat).
func awaitExit(p string) string {
	return fmt.Sprintf(`while kill -0 %[1]s 2>/dev/null && [ "$(sed 's/.*) //;s/ .*//' /proc/%[1]s/stat 2>/dev/null)" != Z ]; do sleep 0.02; done`, p)
}

// killPidFile kills (SIGKILL) the process whose id the file holds, if any: the server a test
// started.
func killPidFile(pid string) {
	b, err := os.ReadFile(pid)
	if err != nil {
		return
	}
	if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		if proc, err := os.FindProcess(p); err == nil {
			_ = proc.Kill()
		}
	}
}

// etcdTools finds etcd and the tool that restores its snapshots: etcdutl, or etcdctl where
// etcdutl is missing (etcd 3.4).
func etcdTools(t *testing.T) (server, restore string) {
	t.Helper()
	server, err := exec.LookPath("etcd")
	if err != nil {
		skipOrFail(t, "etcd is not installed")
	}
	if restore, err = exec.LookPath("etcdutl"); err != nil {
		if restore, err = exec.LookPath("etcdctl"); err != nil {
			skipOrFail(t, "neither etcdutl nor etcdctl is installed")
		}
	}
	return server, restore
}

// waitListening polls until addr accepts TCP connections.
func waitListening(t *testing.T, addr string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after %s", addr, within)
		}
		time.Sleep(50 * time.Millisecond) // polling the server's state
	}
}

// skipOrFail skips the test loudly, or fails it under CI=true, where every tool the tests need
// is installed.
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("!!! " + why)
	}
	t.Skip("!!! " + why)
}

// netnsEtcd starts a three-member etcd cluster, each member in a network namespace of the
// test's own. The members meet on a bridge in this namespace (one veth pair each, a private
// /24); the clients, here, reach member m1 only, through a veth pair of its own (a private
// /30). It returns the URL of m1, all (the URL of every member, m1 first: the others reached
// through the bridge), dev (the bridge's side of m1's link to its peers: set down,
// m1 is cut off from the others while the clients keep talking to it), a --restart-cmd that
// crashes m1 (kill -9) and starts it again from its data directory, and a --restore-cmd that
// kills every member, restores $FENCED_SNAPSHOT into a fresh data directory for each (the
// three at once) and starts them. It skips (fails under CI=true) without root, ip or etcd.
func netnsEtcd(t *testing.T) (url, all, dev, restart, restore string) {
	t.Helper()
	ip := ipTool(t)
	bin, tool := etcdTools(t)
	id := netnsID()
	peerNet := randomSubnet(214)
	clientNet := "10.215" + peerNet[len("10.214"):]
	run := func(args ...string) { t.Helper(); ipRun(t, ip, args...) }
	bridge := "fb" + id
	run("link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command(ip, "link", "del", bridge).Run() })
	run("addr", "add", peerNet+".1/24", "dev", bridge)
	run("link", "set", bridge, "up")

	const members = 3
	dir := t.TempDir()
	var cluster []string
	peerIP := func(i int) string { return fmt.Sprintf("%s.%d", peerNet, 10+i) }
	for i := 1; i <= members; i++ {
		cluster = append(cluster, fmt.Sprintf("m%d=http://%s:2380", i, peerIP(i)))
	}
	var starts, pids, restores, endpoints []string
	for i := 1; i <= members; i++ {
		ns := fmt.Sprintf("fenced-%s-%d", id, i)
		addNetns(t, ip, ns)
		host := fmt.Sprintf("fp%s%d", id, i)
		addVeth(t, ip, host, fmt.Sprintf("fq%s%d", id, i), ns, "", peerIP(i)+"/24")
		run("link", "set", host, "master", bridge)
		advertise := "http://" + peerIP(i) + ":2379"
		endpoints = append(endpoints, peerIP(i)+":2379")
		if i == 1 {
			dev = host
			addVeth(t, ip, "fc"+id, "fd"+id, ns, clientNet+".1/30", clientNet+".2/30")
			advertise = "http://" + clientNet + ".2:2379"
			url = "etcd://" + clientNet + ".2:2379"
			endpoints[0] = clientNet + ".2:2379"
		}
		name, pid := fmt.Sprintf("m%d", i), filepath.Join(dir, fmt.Sprintf("m%d.pid", i))
		start := filepath.Join(dir, name+".start")
		script := fmt.Sprintf(`#!/bin/sh
%[1]s netns exec %[2]s %[3]s --name %[4]s --data-dir %[5]s/%[4]s --listen-client-urls http://0.0.0.0:2379 \
  --advertise-client-urls %[6]s --listen-peer-urls http://%[7]s:2380 --initial-advertise-peer-urls http://%[7]s:2380 \
  --initial-cluster %[8]s --initial-cluster-token fenced-%[9]s >>%[5]s/%[4]s.log 2>&1 &
echo $! > %[10]s
`, ip, ns, bin, name, dir, advertise, peerIP(i), strings.Join(cluster, ","), id, pid)
		if err := os.WriteFile(start, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(start).CombinedOutput(); err != nil {
			t.Fatalf("start etcd %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { killPidFile(pid) })
		if i == 1 {
			restart = killExited(pid) + "; " + start
		}
		starts, pids = append(starts, start), append(pids, pid)
		restores = append(restores, fmt.Sprintf(`(rm -rf %[1]s/%[2]s.restored && ETCDCTL_API=3 %[3]s snapshot restore "$FENCED_SNAPSHOT" \
  --name %[2]s --data-dir %[1]s/%[2]s.restored --initial-cluster %[4]s --initial-cluster-token fenced-%[5]s-restored \
  --initial-advertise-peer-urls http://%[6]s:2380 >>%[1]s/restore.log 2>&1 && rm -rf %[1]s/%[2]s && mv %[1]s/%[2]s.restored %[1]s/%[2]s) & r%[2]s=$!`,
			dir, name, tool, strings.Join(cluster, ","), id, peerIP(i)))
	}
	waitListening(t, strings.TrimPrefix(url, "etcd://"), 20*time.Second)
	// Every member killed at once (their data directories are replaced), the snapshot restored
	// into the three at once, each restore's status collected, then the members started.
	var jobs []string
	for i := 1; i <= members; i++ {
		jobs = append(jobs, fmt.Sprintf(`$rm%d`, i))
	}
	restore = fmt.Sprintf(`ps=$(cat %s); kill -9 $ps; for p in $ps; do %s; done; %s; s=0; for j in %s; do wait $j || s=1; done; [ $s = 0 ] && %s`,
		strings.Join(pids, " "), awaitExit(`"$p"`), strings.Join(restores, "; "), strings.Join(jobs, " "), strings.Join(starts, " && "))
	return url, "etcd://" + strings.Join(endpoints, ","), dev, restart, restore
}
