package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// runTarget is a fresh SQLite file with the resource "job" provisioned.
func runTarget(t *testing.T) target {
	t.Parallel()
	dir := t.TempDir()
	tg := target{t: t, url: "sqlite:" + filepath.Join(dir, "test.db"), dir: dir}
	tg.ok(nil, "provision", "job")
	return tg
}

func TestRunPublishesStdout(t *testing.T) {
	tg := runTarget(t)
	r := tg.run([]byte("from stdin"), "run", "job", "--ttl", "30s", "--",
		"sh", "-c", `echo "$FENCED_RESOURCE $FENCED_GENERATION ${#FENCED_OWNER}"; cat; echo diag >&2`)
	if r.code != 0 || r.stderr != "diag\n" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	got := tg.ok(nil, "get", "job")
	if want := "job 1 26\nfrom stdin"; string(got) != want {
		t.Fatalf("published %q, want %q", got, want)
	}
	if st := tg.show("job"); st.Held || st.PublishedGeneration != 1 {
		t.Fatalf("after run: %+v", st)
	}
}

func TestRunPassesOnFailure(t *testing.T) {
	tg := runTarget(t)
	r := tg.run(nil, "run", "job", "--ttl", "30s", "--", "sh", "-c", "echo partial; exit 3")
	if r.code != 3 || !strings.Contains(r.stderr, "exited with code 3; nothing was published") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if st := tg.show("job"); st.Held || st.PublishedGeneration != 0 {
		t.Fatalf("a failed command published or kept the lease: %+v", st)
	}
	for cmd, why := range map[string]string{
		"no-such-command-here": "executable file not found in $PATH",
		"/no/such/command":     "no such file or directory",
	} {
		r := tg.run(nil, "run", "job", "--ttl", "30s", "--", cmd)
		if want := fmt.Sprintf("cannot start %s: %s; nothing was published.", cmd, why); r.code != 127 ||
			!strings.Contains(r.stderr, want) || strings.Count(r.stderr, cmd) != 1 {
			t.Fatalf("missing command: exit %d, stderr %q, want 127 and %q naming the command once", r.code, r.stderr, want)
		}
	}
	if r := tg.run(nil, "run", "job", "--ttl", "30s", "--", "sh", "-c", "kill -KILL $$"); r.code != 128+int(syscall.SIGKILL) {
		t.Fatalf("command killed by a signal: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestRunLostLeaseTerminates: without renewal the trust window ends while the command runs; it
// gets SIGTERM, nothing is published, and the exit code is 5.
func TestRunLostLeaseTerminates(t *testing.T) {
	tg := runTarget(t)
	r := tg.run(nil, "run", "job", "--ttl", "300ms", "--",
		"sh", "-c", `trap 'echo TERM >&2; exit 0' TERM; echo output; while :; do sleep 0.05; done`)
	// The whole group got SIGTERM: the shell's trap ran (and sh may report its killed sleep).
	if r.code != 5 || !strings.Contains("\n"+r.stderr, "\nTERM\n") || !strings.Contains(r.stderr, "lease lost") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if st := tg.show("job"); st.PublishedGeneration != 0 {
		t.Fatalf("a lost lease published: %+v", st)
	}
}

// TestRunKillsAfterGrace: a command that ignores SIGTERM is killed, with its children.
func TestRunKillsAfterGrace(t *testing.T) {
	tg := runTarget(t)
	pidFile := filepath.Join(tg.dir, "child.pid")
	r := tg.run(nil, "run", "job", "--ttl", "2s", "--grace", "200ms", "--",
		"sh", "-c", `trap '' TERM; sleep 60 & echo $! > `+pidFile+`; wait`)
	if r.code != 5 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The child was in the command's process group: it got SIGKILL as well. A zombie not yet
	// reaped by init still answers kill(pid, 0), so look at its state instead.
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !bytes.Contains(stat, []byte(") Z")) {
		t.Fatalf("the command's child %d survived: %s", pid, stat)
	}
}

func TestRunRenewsPastTTL(t *testing.T) {
	tg := runTarget(t)
	r := tg.run(nil, "run", "job", "--ttl", "600ms", "--renew", "--", "sh", "-c", "sleep 1.5; echo long")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if got := tg.ok(nil, "get", "job"); string(got) != "long\n" {
		t.Fatalf("published %q", got)
	}
}

func TestRunBusyAndBadInput(t *testing.T) {
	tg := runTarget(t)
	marker := filepath.Join(tg.dir, "ran")
	tg.acquire("job", "1m")
	tg.fails(3, nil, "run", "job", "--ttl", "30s", "--", "touch", marker)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran although the lease was busy")
	}
	tg.fails(2, nil, "run", "job", "--ttl", "30s")
	tg.fails(2, nil, "run", "job", "--", "true")
	tg.fails(2, nil, "run", "job", "--ttl", "0s", "--", "true")
	tg.fails(2, nil, "run", "job", "extra", "--ttl", "1s", "--", "true")
	tg.fails(4, nil, "run", "missing", "--ttl", "1s", "--", "touch", marker)
	if msg := tg.fails(2, nil, "run", "job", "--ttl", "30s", "--grace", "10s", "--", "touch", marker); !strings.Contains(msg,
		"--grace 10s is longer than the safety margin 3s of --ttl 30s") || !strings.Contains(msg, "longer --ttl") {
		t.Errorf("a grace past the margin: %q", msg)
	}

	tg.ok(nil, "provision", "big")
	r := tg.run(nil, "run", "big", "--ttl", "30s", "--", "head", "-c", "4194305", "/dev/zero")
	if r.code != 2 || !strings.Contains(r.stderr, "larger than the payload limit") {
		t.Fatalf("oversize output: exit %d, stderr %q", r.code, r.stderr)
	}
	if st := tg.show("big"); st.PublishedGeneration != 0 || st.Held {
		t.Fatalf("oversize output published or kept the lease: %+v", st)
	}
}
