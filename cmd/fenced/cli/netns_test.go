package cli_test

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The network namespaces of the tests' own, shared by the servers they run behind a link the
// partition and loss faults can cut: Redis, PostgreSQL and MariaDB (netnsLink) and the etcd
// members (netnsEtcd). Every name carries a random id, every address a random private subnet,
// so that tests running at once never share one; everything is removed when the test ends.

// ipTool returns the path of ip(8); it skips (fails under CI=true) without root or iproute2.
func ipTool(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "network namespaces need root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		skipOrFail(t, "ip (iproute2) is not installed")
	}
	return ip
}

// netnsID is a short random id for the names of namespaces and interfaces (at most 15 bytes).
func netnsID() string { return strings.ToLower(rand.Text()[:6]) }

// ipRun runs ip(8) and fails the test if it fails.
func ipRun(t *testing.T, ip string, args ...string) {
	t.Helper()
	if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// addNetns creates a network namespace with its loopback up, deleted when the test ends. It
// skips (fails under CI=true) where namespaces cannot be made.
func addNetns(t *testing.T, ip, ns string) {
	t.Helper()
	if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
		skipOrFail(t, fmt.Sprintf("cannot create a network namespace here: %v: %s", err, out))
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	ipRun(t, ip, "netns", "exec", ns, "ip", "link", "set", "lo", "up")
}

// addVeth creates a veth pair, host here and inner moved into ns, deleted when the test ends
// (deleting one end deletes both). Addresses (CIDR) are set and both ends brought up when
// given; host may also be left to a bridge (hostCIDR empty).
func addVeth(t *testing.T, ip, host, inner, ns, hostCIDR, innerCIDR string) {
	t.Helper()
	ipRun(t, ip, "link", "add", host, "type", "veth", "peer", "name", inner)
	t.Cleanup(func() { _ = exec.Command(ip, "link", "del", host).Run() })
	ipRun(t, ip, "link", "set", inner, "netns", ns)
	if hostCIDR != "" {
		ipRun(t, ip, "addr", "add", hostCIDR, "dev", host)
	}
	ipRun(t, ip, "link", "set", host, "up")
	if innerCIDR != "" {
		ipRun(t, ip, "netns", "exec", ns, "ip", "addr", "add", innerCIDR, "dev", inner)
	}
	ipRun(t, ip, "netns", "exec", ns, "ip", "link", "set", inner, "up")
}

// randomSubnet is the first three bytes of a random /24 in 10.first.0.0/16.
func randomSubnet(first int) string {
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	return fmt.Sprintf("10.%d.%d", first, b[0])
}

// netnsLink is a namespace of the test's own and the one link to it: a veth pair on a
// private /30, its host side dev (what --partition-dev names), the namespace's address addr.
type netnsLink struct {
	ip, ns, dev, addr string
}

// newNetnsLink makes a namespace reached from this one through a veth pair on a random /30
// (10.213.x.4k/30: two tests colliding would fail to add the address, not share it).
func newNetnsLink(t *testing.T) netnsLink {
	t.Helper()
	ip := ipTool(t)
	id := netnsID()
	l := netnsLink{ip: ip, ns: "fenced-" + id, dev: "fh" + id}
	addNetns(t, ip, l.ns)
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	sub, k := randomSubnet(213), 4*int(b[0]%64)
	l.addr = fmt.Sprintf("%s.%d", sub, k+2)
	addVeth(t, ip, l.dev, "fn"+id, l.ns, fmt.Sprintf("%s.%d/30", sub, k+1), l.addr+"/30")
	return l
}

// in prefixes a command so that it runs in the namespace.
func (l netnsLink) in(argv ...string) []string {
	return append([]string{l.ip, "netns", "exec", l.ns}, argv...)
}

// crash is a shell command that kills (-9) every process in the namespace, the server there
// crashing at once, and waits until they are gone, reaped too: a postmaster that finds the
// pid of its lock file alive (a zombie) refuses to start.
func (l netnsLink) crash() string {
	return fmt.Sprintf(`ps=$(%s); [ -z "$ps" ] || kill -9 $ps; for p in $ps; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done`,
		shellJoin([]string{l.ip, "netns", "pids", l.ns}))
}

// pids lists the processes in the namespace.
func (l netnsLink) pids(t *testing.T) []int {
	t.Helper()
	out, err := exec.Command(l.ip, "netns", "pids", l.ns).Output()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", l.ns, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("ip netns pids %s: %q", l.ns, out)
		}
		pids = append(pids, p)
	}
	return pids
}

// stopAll stops (SIGTERM) every process in the namespace and waits up to 30s for them to exit.
func (l netnsLink) stopAll(t *testing.T) {
	t.Helper()
	for _, p := range l.pids(t) {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(30 * time.Second); len(l.pids(t)) > 0; {
		if time.Now().After(deadline) {
			t.Errorf("processes left in the namespace %s 30s after SIGTERM", l.ns)
			return
		}
		time.Sleep(50 * time.Millisecond) // polling the processes' exit
	}
}

// shellJoin quotes argv for sh -c.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
