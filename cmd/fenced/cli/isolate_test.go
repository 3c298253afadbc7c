package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// isolatedLine is the report's line on the requests an isolated worker sent while cut off and
// that were answered after the heal.
var isolatedLine = regexp.MustCompile(`isolate: requests of a cut-off worker sent while cut off and answered after the heal: (.*)`)

// cutHeld is the report's line when no request of a cut-off worker was answered by the database
// before the heal: the cut held (a link never set down fails here).
const cutHeld = "isolate: requests of a cut-off worker answered by the database while cut off: none"

// checkIsolateCleanedUp requires that the run whose output is out left no namespace, link or
// masquerade behind, and gave the server's link dev its forwarding back (0, as the test made it).
func checkIsolateCleanedUp(t *testing.T, out, dev string) {
	t.Helper()
	m := regexp.MustCompile(`\(fenced-w(\d+)-1 `).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("the run does not name its workers' namespaces")
	}
	leftIn(t, m[1], dev)
}

// leftIn checks what the run of pid may have left behind.
func leftIn(t *testing.T, pid, dev string) {
	t.Helper()
	if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); bytes.Contains(out, []byte("fenced-w"+pid+"-")) {
		t.Errorf("a worker's namespace is left behind:\n%s", out)
	}
	if out, _ := exec.Command("ip", "-o", "link", "show").CombinedOutput(); bytes.Contains(out, []byte("fw"+pid+"s")) {
		t.Errorf("a worker's link is left behind:\n%s", out)
	}
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); bytes.Contains(out, []byte("fenced_torture_nat_"+pid+"\n")) {
		t.Errorf("the workers' masquerade is left behind:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", dev, "forwarding")); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("the forwarding of %s is %q (%v) after the run, want 0 as before it", dev, b, err)
	}
}

// TestTortureIsolate runs the database server in a network namespace of the test's own and two
// of the four workers each in one of torture's own (--worker-netns 2): the isolate fault holds
// one of them just before a publication, cuts it off from the server, lets it call the
// publication once another worker has acquired that resource (torture.Hold, the forced
// schedule of isolate in isolate.go) and heals it while the others keep working. Fenced, the
// checker finds nothing and the publication sent while cut off, answered after the heal, is
// refused: the fence at work on a delayed write. Unfenced (a plain lock), the same schedule
// shows it accepted after the successor's acknowledged acquisition (invariant 3).
func TestTortureIsolate(t *testing.T) {
	t.Parallel()
	for _, s := range netnsServers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			nftTool(t)
			url, dev := s.start(t)
			args := []string{"--duration", "12s", "--faults", "isolate", "--worker-netns", "2"}
			t.Run("fenced", func(t *testing.T) {
				report := t.TempDir()
				code, out := runTortureIn(t, report, url, args...)
				if code != 0 || !strings.Contains(out, "RESULT: no violations found") {
					t.Fatalf("fenced torture with isolated workers: exit %d, want 0 and no violations", code)
				}
				checkTortured(t, out, "isolate")
				if !strings.Contains(out, cutHeld) {
					t.Error("a cut-off worker's request was answered by the database before the heal")
				}
				m := isolatedLine.FindStringSubmatch(out)
				if m == nil || !regexp.MustCompile(`(publish|publish_release|renew|release) refused [1-9]`).MatchString(m[1]) {
					t.Errorf("no request of an isolated worker, sent while cut off, was refused after the heal: %q", m)
				}
				page, err := os.ReadFile(filepath.Join(report, "index.html"))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Contains(page, []byte(">isolated</text>")) {
					t.Error("the timeline shows no isolation")
				}
				checkIsolateCleanedUp(t, out, dev)
			})
			t.Run("unfenced", func(t *testing.T) {
				code, out := runTortureIn(t, t.TempDir(), url, append(args, "--unfenced")...)
				if code != 7 || !strings.Contains(out, "VIOLATED 3 fence") {
					t.Fatalf("unfenced torture with isolated workers: exit %d, want 7 and fence violations", code)
				}
				// A plain lock's write is never refused: the fence violations above are the
				// stale publications the isolate fault forces, accepted after the heal.
				if m := isolatedLine.FindStringSubmatch(out); m == nil || !regexp.MustCompile(`publish ok [1-9]`).MatchString(m[1]) {
					t.Errorf("no publication of an isolated worker, sent while cut off, was accepted after the heal: %q", m)
				}
				if !strings.Contains(out, cutHeld) {
					t.Error("a cut-off worker's request was answered by the database before the heal")
				}
				checkIsolateCleanedUp(t, out, dev)
			})
		})
	}
}

// TestTortureIsolateEtcd is TestTortureIsolate's control on a three-member etcd (netnsEtcd):
// the workers in namespaces of torture's own reach m1 through its client link. The partition
// fault shows no stale write on etcd (m1 cut off from its quorum applies nothing); a worker cut
// off from a healthy cluster while it holds a lease does: through a plain lock, its delayed
// publication is accepted after another worker took the lease over. The fenced run with the
// same fault is make torture's (TestTortureEveryBackend): both here would take twice the time,
// and two runs at once on one server's link would not give the link its forwarding back (each
// saves the value the other set).
func TestTortureIsolateEtcd(t *testing.T) {
	t.Parallel()
	nftTool(t)
	url, _, peer, _, _ := netnsEtcd(t)
	// m1's client link is named after the same id as its peer link (fp<id>1, fc<id>).
	dev := "fc" + strings.TrimSuffix(strings.TrimPrefix(peer, "fp"), "1")
	// Every build short (no worker outlives its lease by itself): the violations are the cut's.
	code, out := runTorture(t, url, "--duration", "12s", "--faults", "isolate", "--worker-netns", "2", "--unfenced", "--short-builds")
	checkIsolateControl(t, code, out)
	checkIsolateCleanedUp(t, out, dev)
}

// checkIsolateControl asserts what an unfenced run with the isolate fault must show: a
// publication of an isolated worker, sent while cut off, accepted after the heal, and the
// checker finding a fence violation (exit 7). The fault forces it: the publication is called
// only after another worker's acquisition of the resource was acknowledged (isolate), so the
// checker places it after that acquisition whenever the late request reached the server.
func checkIsolateControl(t *testing.T, code int, out string) {
	t.Helper()
	if code != 7 || !strings.Contains(out, "VIOLATED 3 fence") {
		t.Fatalf("unfenced torture with isolated workers: exit %d, want 7 and fence violations", code)
	}
	if m := isolatedLine.FindStringSubmatch(out); m == nil || !regexp.MustCompile(`publish ok [1-9]`).MatchString(m[1]) {
		t.Errorf("no publication of an isolated worker, sent while cut off, was accepted after the heal: %q", m)
	}
	if !strings.Contains(out, cutHeld) {
		t.Error("a cut-off worker's request was answered by the database before the heal")
	}
	checkTortured(t, out, "isolate")
}

// TestTortureIsolateInterrupted interrupts a run (SIGINT, as Ctrl-C) while a worker is cut
// off: the link is healed (the nemesis's record says so, with no error), the namespaces, the
// links and the masquerade are removed, the server's link gets its forwarding back, and the
// report is written.
func TestTortureIsolateInterrupted(t *testing.T) {
	t.Parallel()
	nftTool(t)
	url, dev := netnsPostgres(t)
	report := t.TempDir()
	cmd := exec.Command(bin, "torture", "--seed", tortureSeed, "--duration", "60s", "--report", report,
		"--faults", "isolate", "--worker-netns", "1")
	cmd.Env = append(os.Environ(), "FENCED_DB="+url)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := fmt.Sprint(cmd.Process.Pid)
	// The barrier: the run has started (its nemesis's history exists: the links are made and
	// up) and the worker's link is down (the first fault comes 1-2 s into the run).
	link, started := "fw"+pid+"s1", filepath.Join(report, "history", "nemesis.jsonl")
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(started); err == nil {
			out, err := exec.Command("ip", "-o", "link", "show", "dev", link).CombinedOutput()
			if err == nil && bytes.Contains(out, []byte("state DOWN")) {
				break
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("no isolation within 30s:\n%s", buf.String())
		}
		time.Sleep(20 * time.Millisecond) // polling for the barrier
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	t.Logf("interrupted during an isolation:\n%s", buf.String())
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(buf.String(), "report written") {
		t.Errorf("exit %d, want 1 with the report written", code)
	}
	nem, err := os.ReadFile(filepath.Join(report, "history", "nemesis.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`"event":"isolate"[^\n]*"detail":"[^"]* down\) [^"]*, then healed"`).Match(nem) {
		t.Errorf("no isolation healed without error recorded:\n%s", nem)
	}
	leftIn(t, pid, dev)
}

// TestTortureWorkerNetnsUsage: --worker-netns and the isolate fault reject nonsense with one
// sentence naming the problem (exit 2), before anything is made.
func TestTortureWorkerNetnsUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := map[string]string{
		"torture --worker-netns 1":                                            "invalid --worker-netns: SQLite is embedded in each process",
		"--db postgres://127.0.0.1:1/x torture --worker-netns -1":             "invalid --worker-netns -1: 0 to --workers (4)",
		"--db postgres://127.0.0.1:1/x torture --worker-netns 5":              "invalid --worker-netns 5: 0 to --workers (4)",
		"--db postgres://127.0.0.1:1/x torture --workers 2 --worker-netns 3":  "invalid --worker-netns 3: 0 to --workers (2)",
		"--db postgres://127.0.0.1:1/x torture --worker-netns many":           "invalid argument \"many\"",
		"--db postgres://127.0.0.1:1/x torture --worker-netns 1 --gate":       "cannot reach the participating service",
		"--db redis://127.0.0.1:1/0 torture --faults isolate":                 "the isolate fault does not apply to Redis: needs --worker-netns N",
		"--db postgres:///x?host=/tmp torture --worker-netns 1 --faults kill": "invalid --worker-netns",
	}
	if os.Geteuid() == 0 {
		cases["--db postgres://127.0.0.1:1/x torture --worker-netns 1"] = "the database's host 127.0.0.1 is a loopback address"
		cases["--db redis://localhost:1/0 torture --worker-netns 2 --faults isolate"] = "the database's host localhost"
	}
	for args, want := range cases {
		r := runIn(t, dir, "", nil, strings.Fields(args)...)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("fenced %s: exit %d, stderr %q; want 2 and one sentence saying %q", args, r.code, r.stderr, want)
		}
	}
}
