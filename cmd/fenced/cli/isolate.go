package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// workerNets is the network of --worker-netns: each of the first n worker slots runs in a
// network namespace of its own, reached from the host's namespace through a veth pair of its
// own on a /30 of a private /24, with a default route to the host side. The host forwards
// from these links to the database server's link (a veth or bridge to the server's own
// namespace) and masquerades, so that the server needs no route back. Setting the host side
// of a slot's veth down cuts that worker alone off from the server (the isolate fault).
//
// Only links of the run's own and the server's link get forwarding turned on (per device,
// never the host's ip_forward), and the server's link gets its earlier value back at the end.
type workerNets struct {
	ip      string
	pid     int
	n       int
	subnet  string            // "10.216.x": slot k is 10.216.x.4k+1 (host) and .4k+2 (worker)
	forward map[string]string // the server's links whose forwarding was turned on → the earlier value
	nat     string            // the nftables table masquerading the workers, "" when none
	made    int               // slots whose namespace exists
}

// ns is the network namespace of a worker slot (0-based), named after the run's pid so that
// two runs never share one and a test can find them.
func (w *workerNets) ns(slot int) string { return fmt.Sprintf("fenced-w%d-%d", w.pid, slot+1) }

// dev is the host side of a slot's veth pair: what the isolate fault sets down.
func (w *workerNets) dev(slot int) string { return fmt.Sprintf("fw%ds%d", w.pid, slot+1) }

// workerNetnsApplies checks --worker-netns N against the run: it returns a usage error naming
// the problem, or the links through which the workers reach the database (forwarded: a veth
// or a bridge to a namespace of this machine; none when the server is at a local address).
func workerNetnsApplies(n, workers int, scheme, url string, gate bool, azure string) ([]string, error) {
	switch {
	case n < 0 || n > workers:
		return nil, usagef("invalid --worker-netns %d: 0 to --workers (%d)", n, workers)
	case scheme == "sqlite":
		return nil, usagef("invalid --worker-netns: SQLite is embedded in each process, there is no network between a worker and the database")
	case gate || azure != "":
		return nil, usagef("invalid --worker-netns: the workers in namespaces of their own cannot reach the participating service of --gate or --azure on this host's loopback")
	case os.Geteuid() != 0:
		return nil, usagef("invalid --worker-netns: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, usagef("invalid --worker-netns: needs ip (iproute2)")
	}
	_, addrs, _, err := urlHosts(url)
	if err != nil {
		return nil, usagef("invalid --worker-netns: %v", err)
	}
	var devs []string
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		dev, err := serverLink(host)
		if err != nil {
			return nil, usagef("invalid --worker-netns: %v", err)
		}
		if dev != "" && !contains(devs, dev) {
			devs = append(devs, dev)
		}
	}
	return devs, nil
}

// serverLink returns the link through which this host reaches the database server at host, ""
// when host is one of its own addresses, or why workers in namespaces of their own cannot
// reach it.
func serverLink(host string) (string, error) {
	ips, err := net.LookupIP(host)
	if err != nil {
		return "", fmt.Errorf("resolve the database's host %q: %w", host, err)
	}
	var ip net.IP
	for _, c := range ips {
		if c.To4() != nil {
			ip = c
			break
		}
	}
	switch {
	case ip == nil:
		return "", fmt.Errorf("the database's host %q has no IPv4 address (the workers' links are IPv4)", host)
	case ip.IsLoopback():
		return "", fmt.Errorf("the database's host %s is a loopback address, which a worker in a network namespace of its own cannot reach; run the server in a network namespace reached through a veth pair (docs/TORTURE.md)", host)
	}
	out, err := exec.Command("ip", "-o", "route", "get", ip.String()).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip route get %s: %w: %s", ip, err, strings.TrimSpace(string(out)))
	}
	f := strings.Fields(string(out))
	dev := ""
	for i := range f[:max(len(f)-1, 0)] {
		if f[i] == "dev" {
			dev = f[i+1]
		}
	}
	switch {
	case dev == "lo" || strings.HasPrefix(f[0], "local"):
		return "", nil
	case dev == "":
		return "", fmt.Errorf("no route to the database's host %s", ip)
	}
	// Forwarding is turned on only on a link to a namespace of this machine, never on the
	// host's way out.
	if _, err := os.Stat(filepath.Join("/sys/class/net", dev, "bridge")); err == nil {
		return dev, nil
	}
	kind, _ := exec.Command("ip", "-d", "-o", "link", "show", "dev", dev).CombinedOutput()
	if strings.Contains(string(kind), " veth ") {
		return dev, nil
	}
	return "", fmt.Errorf("the route to the database's host %s leaves through %s, not a veth pair or a bridge to a network namespace of this machine; torture turns forwarding on only there", ip, dev)
}

// newWorkerNets makes the namespaces of the first n slots and their links, routed to the
// server's links devs. On error, whatever was made is removed.
func newWorkerNets(ctx context.Context, n int, devs []string) (_ *workerNets, err error) {
	ip, err := exec.LookPath("ip")
	if err != nil {
		return nil, err
	}
	// Not cut short by an interruption: an ip or nft call killed after it made a namespace or
	// the masquerade, but before it said so, would leave them behind (see netCtx). The setup
	// is a few dozen short calls.
	ctx = context.WithoutCancel(ctx)
	w := &workerNets{ip: ip, pid: os.Getpid(), n: n, forward: map[string]string{}}
	if w.subnet, err = freeSubnet(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, w.close())
		}
	}()
	run := func(args ...string) error {
		if out, err := exec.CommandContext(ctx, ip, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	for slot := range n {
		ns, dev, inner := w.ns(slot), w.dev(slot), fmt.Sprintf("fx%ds%d", w.pid, slot+1)
		host, worker := fmt.Sprintf("%s.%d", w.subnet, 4*slot+1), fmt.Sprintf("%s.%d", w.subnet, 4*slot+2)
		if err := run("netns", "add", ns); err != nil {
			return nil, err
		}
		w.made++
		for _, args := range [][]string{
			{"-n", ns, "link", "set", "lo", "up"},
			{"link", "add", dev, "type", "veth", "peer", "name", inner},
			{"link", "set", inner, "netns", ns},
			{"addr", "add", host + "/30", "dev", dev},
			{"link", "set", dev, "up"},
			{"-n", ns, "addr", "add", worker + "/30", "dev", inner},
			{"-n", ns, "link", "set", inner, "up"},
			{"-n", ns, "route", "add", "default", "via", host},
		} {
			if err := run(args...); err != nil {
				return nil, err
			}
		}
		if len(devs) > 0 {
			if err := setForwarding(dev, "1"); err != nil {
				return nil, err
			}
		}
	}
	if len(devs) == 0 {
		return w, nil // the server is at an address of this host: delivered, not forwarded
	}
	for _, dev := range devs {
		old, err := os.ReadFile(forwardingPath(dev))
		if err != nil {
			return nil, fmt.Errorf("read the forwarding of %s: %w", dev, err)
		}
		w.forward[dev] = strings.TrimSpace(string(old))
		if err := setForwarding(dev, "1"); err != nil {
			return nil, err
		}
	}
	w.nat = fmt.Sprintf("fenced_torture_nat_%d", w.pid)
	var b strings.Builder
	fmt.Fprintf(&b, "table ip %s {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n", w.nat)
	for _, dev := range devs {
		fmt.Fprintf(&b, "\t\tip saddr %s.0/24 oifname %q masquerade\n", w.subnet, dev)
	}
	b.WriteString("\t}\n}\n")
	if _, err := nft(ctx, b.String(), "-f", "-"); err != nil {
		w.nat = ""
		return nil, fmt.Errorf("masquerade the workers' namespaces: %w", err)
	}
	return w, nil
}

func forwardingPath(dev string) string {
	return filepath.Join("/proc/sys/net/ipv4/conf", dev, "forwarding")
}

func setForwarding(dev, v string) error {
	if err := os.WriteFile(forwardingPath(dev), []byte(v+"\n"), 0o644); err != nil {
		return fmt.Errorf("set the forwarding of %s to %s: %w", dev, v, err)
	}
	return nil
}

// freeSubnet draws a /24 in 10.216.0.0/16 that no address of this host is in.
func freeSubnet() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	b := make([]byte, 1)
	for range 20 {
		_, _ = rand.Read(b)
		sub := fmt.Sprintf("10.216.%d", int(b[0])%250+1)
		taken := false
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), sub+".") {
				taken = true
			}
		}
		if !taken {
			return sub, nil
		}
	}
	return "", errors.New("no free /24 in 10.216.0.0/16 for the workers' namespaces")
}

// close removes the masquerade, gives the server's links their forwarding back and deletes
// the namespaces (which deletes the veth pairs). It keeps going past errors.
func (w *workerNets) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	if w.nat != "" {
		if _, err := nft(ctx, "", "delete", "table", "ip", w.nat); err != nil {
			errs = append(errs, err)
		}
	}
	for dev, old := range w.forward {
		if err := setForwarding(dev, old); err != nil {
			errs = append(errs, err)
		}
	}
	for slot := range w.made {
		_ = exec.CommandContext(ctx, w.ip, "link", "del", w.dev(slot)).Run() // gone with its namespace otherwise
		if out, err := exec.CommandContext(ctx, w.ip, "netns", "del", w.ns(slot)).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", w.ns(slot), err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// command is the worker's command line run in its slot's namespace, if it has one.
func (w *workerNets) command(slot int, exe string, args []string) *exec.Cmd {
	if w == nil || slot >= w.n {
		return exec.Command(exe, args...)
	}
	// ip netns exec enters the namespace and execs the worker in the same process, so that
	// the pid the nemesis signals is the worker's.
	return exec.Command(w.ip, append([]string{"netns", "exec", w.ns(slot), exe}, args...)...)
}

// isolate is the isolate fault: f.Count workers from slot f.Slot on (among the slots with a
// namespace) are cut off from the database, then healed, also when the run is interrupted
// meanwhile; the others keep working. The schedule is forced, not hoped for (torture.Hold):
//
//  1. the first of them is held just before its next publication, holding a lease, and cut
//     off there (the others with it);
//  2. it stays held until another worker reports that it acquired that resource with a higher
//     generation (the acquisition's RETURN is recorded by then), so that the lease is taken
//     over before the stale publication is even called;
//  3. it is let go and its publication's CALL is recorded while it is cut off: the request
//     stalls in TCP's retransmissions;
//  4. the link is healed once f.For has passed since the cut, and no sooner than healAfterCall
//     after that CALL, and the late request arrives: the fence must refuse it, a plain lock
//     accepts it after an acknowledged acquisition with a higher token (invariant 3, certain).
//
// A step that does not come within its bound (no publication within awaitBound, no takeover
// before the run's end) is said in the nemesis's record, and the fault goes on untargeted.
func (t *tortureRun) isolate(ctx context.Context, f torture.Fault) {
	w := t.nets
	count := min(max(f.Count, 1), w.n)
	var slots []int
	for i := range count {
		slots = append(slots, (f.Slot+i)%w.n)
	}
	t.mu.Lock()
	procs := make([]*tortureProc, len(slots))
	for i, s := range slots {
		procs[i] = t.procs[s]
	}
	t.mu.Unlock()
	var (
		begin int64
		cut   []int // slots whose link went down
		errs  []string
	)
	cutAll := func() {
		if ctx.Err() != nil {
			return
		}
		downCtx, cancel := netCtx(ctx) // not killed by an interruption half-way (see netCtx)
		defer cancel()
		for _, s := range slots {
			if err := setLink(downCtx, w.dev(s), false); err != nil {
				errs = append(errs, err.Error())
				continue
			}
			cut = append(cut, s)
		}
		begin = torture.Now()
	}
	how := "untargeted: no publication was reported within " + awaitBound.String()
	var (
		heldRes string
		heldGen int64
		called  time.Time // when the held worker's publication was called, if it was
	)
	p := procs[0]
	aimed := false
	if p != nil && p.control != nil {
		tr := p.setTrap("held publish ", func(line string) {
			// "held publish RESOURCE GENERATION": the worker waits for "go".
			if _, err := fmt.Sscanf(line, "held publish %s %d", &heldRes, &heldGen); err != nil {
				errs = append(errs, fmt.Sprintf("read %q: %v", line, err))
			}
			cutAll()
		})
		p.tell("hold publish")
		aimed = t.await(ctx, p, tr)
		if !aimed {
			p.tell("go") // disarm; lets it go if it was held after all
		}
	}
	if !aimed {
		if ctx.Err() != nil {
			return // interrupted before the cut
		}
		cutAll()
	}
	if aimed {
		cutAt := time.Now()
		bound := time.Until(t.end())
		taken := t.awaitTakeover(ctx, heldRes, heldGen, bound)
		took := time.Since(cutAt).Round(time.Millisecond)
		call := p.setTrap("call publish", func(string) { called = time.Now() })
		p.tell("go")
		t.await(ctx, p, call)
		switch {
		case taken && !called.IsZero():
			how = fmt.Sprintf("held before its publication of %s generation %d, which it called once another worker had acquired a higher generation (%s after the cut)",
				heldRes, heldGen, took)
		case taken:
			how = fmt.Sprintf("held before its publication of %s generation %d until another worker had acquired a higher generation (%s after the cut); no publication was called within %s",
				heldRes, heldGen, took, awaitBound)
		default:
			how = fmt.Sprintf("held before its publication of %s generation %d; no other worker acquired it before the run's end (%s after the cut), then let go",
				heldRes, heldGen, took)
		}
		if !called.IsZero() {
			wait(ctx, time.Until(called.Add(healAfterCall)))
		}
		wait(ctx, time.Until(cutAt.Add(f.For)))
	}
	if len(cut) == 0 {
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "error", Detail: "isolate: " + strings.Join(errs, "; ")})
		return
	}
	if !aimed {
		wait(ctx, f.For)
	}
	// Healed whatever happened, with a context of its own: an interrupted run must not leave a
	// worker cut off (its namespace is removed at the end in any case).
	healCtx, cancel := netCtx(ctx)
	defer cancel()
	// The isolation ends, in the history, at the last instant every link was still down: an
	// answer after it came after a heal. Taken after the heal, it counted a late request that
	// the first link's heal let through while ip was still setting the next link up as
	// answered while cut off.
	end := torture.Now()
	for _, s := range slots { // every slot: a down call that failed may have taken effect
		if err := setLink(healCtx, w.dev(s), true); err != nil && slices.Contains(cut, s) {
			errs = append(errs, err.Error())
		}
	}
	for i, s := range cut {
		name := fmt.Sprintf("slot %d", s)
		p := procs[slices.Index(slots, s)]
		if p != nil {
			name = p.name
		}
		detail := fmt.Sprintf("%s cut off from the database (%s down) %s, at least %s, then healed", name, w.dev(s), how, f.For)
		if len(cut) > 1 {
			detail += fmt.Sprintf(" (%d of %d workers cut at once)", i+1, len(cut))
		}
		if len(errs) > 0 {
			detail += "; " + strings.Join(errs, "; ")
		}
		rec := torture.Record{Kind: torture.KindEvent, Event: torture.FaultIsolate, Slot: s, Time: begin, EndTime: end, Detail: detail}
		if p != nil {
			rec.Proc = p.name
		}
		_ = t.nem.Write(rec)
	}
}

// healAfterCall is how long the held worker's publication is in flight, at least, before the
// heal: longer than any TTL, as every cut is, so that the request is out and stalled, and so
// that a cut that did not happen shows (the publication then answered before the heal, which
// the tests' controls reject).
const healAfterCall = torture.TTLMax + 200*time.Millisecond

// sawBuild notes a worker's "build RESOURCE GENERATION" phase line (awaitTakeover).
func (t *tortureRun) sawBuild(line string) {
	var (
		res string
		gen int64
	)
	if _, err := fmt.Sscanf(line, "build %s %d", &res, &gen); err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.built == nil {
		t.built = map[string]int64{}
	}
	if gen > t.built[res] {
		t.built[res] = gen
	}
	if t.builtSeen != nil {
		close(t.builtSeen)
	}
	t.builtSeen = make(chan struct{})
}

// awaitTakeover waits up to bound until some worker has reported acquiring resource with a
// generation above gen; it reports whether one did.
func (t *tortureRun) awaitTakeover(ctx context.Context, resource string, gen int64, bound time.Duration) bool {
	timer := time.NewTimer(max(bound, 0))
	defer timer.Stop()
	for {
		t.mu.Lock()
		got := t.built[resource]
		if t.builtSeen == nil {
			t.builtSeen = make(chan struct{})
		}
		seen := t.builtSeen
		t.mu.Unlock()
		if got > gen {
			return true
		}
		select {
		case <-seen:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
