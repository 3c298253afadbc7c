//go:build linux

package cli_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// groupMembers lists the live (not zombie) processes whose process group is pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		state, _, pgrp, ok := procStat(pid)
		if ok && state != "Z" && pgrp == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStat reads a process's state, parent and process group from /proc; ok is false when it
// is gone.
func procStat(pid int) (state string, ppid, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, 0, false
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 3 {
		return "", 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	pgrp, _ = strconv.Atoi(f[2])
	return f[0], ppid, pgrp, true
}

// alive says whether pid is a live (not zombie) process.
func alive(pid int) bool {
	state, _, _, ok := procStat(pid)
	return ok && state != "Z"
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// startRun starts fenced run in the background; the command must print its pid on stderr
// first, which startRun returns once read, the rest of stderr still to be read.
func startRun(t *testing.T, tg target, args ...string) (*exec.Cmd, *bufio.Reader, int) {
	t.Helper()
	return startRunVia(t, tg, nil, args...)
}

// startRunVia is startRun with fenced started through wrapper (a command that execs its
// arguments), if any.
func startRunVia(t *testing.T, tg target, wrapper []string, args ...string) (*exec.Cmd, *bufio.Reader, int) {
	t.Helper()
	argv := append(append(slices.Clone(wrapper), bin), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = tg.dir
	cmd.Env = append(os.Environ(), "FENCED_DB="+tg.url)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	t.Cleanup(func() { timer.Stop() })
	r := bufio.NewReader(stderr)
	line, err := r.ReadString('\n') // the barrier: the command runs
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the command never printed its pid: %q, %v", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // whatever a failed test left
	return cmd, r, pid
}

// TestRunHangupStopsGroup: a fenced run whose terminal or ssh session goes away (SIGHUP) stops
// the command's whole process group, publishes nothing, releases the lease and exits 1.
// Without SIGHUP among the signals fenced handles, fenced died of it at once (exit by signal)
// and the command's group, in a process group of its own, ran on.
func TestRunHangupStopsGroup(t *testing.T) {
	tg := runTarget(t)
	cmd, stderr, pgid := startRun(t, tg, "run", "job", "--ttl", "30s", "--",
		"sh", "-c", `echo $$ >&2; sleep 60 & wait`)
	if !eventually(t, 10*time.Second, func() bool { return len(groupMembers(t, pgid)) == 2 }) {
		t.Fatalf("the command's group %d never had its two processes: %v", pgid, groupMembers(t, pgid))
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	rest := new(bytes.Buffer)
	_, _ = rest.ReadFrom(stderr)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("fenced after SIGHUP: %v, want exit code 1 (stderr %q)", err, rest)
	}
	if !strings.Contains(rest.String(), "hangup") || !strings.Contains(rest.String(), "nothing was published") {
		t.Errorf("stderr %q does not name the hang-up and say that nothing was published", rest)
	}
	if !eventually(t, 10*time.Second, func() bool { return len(groupMembers(t, pgid)) == 0 }) {
		t.Fatalf("the command's group outlived fenced: %v", groupMembers(t, pgid))
	}
	if st := tg.show("job"); st.Held || st.PublishedGeneration != 0 {
		t.Fatalf("after SIGHUP: %+v", st)
	}
}

// TestRunKilledTakesCommand: kill -9 of fenced run takes the command's first process with it
// (the parent-death signal); without it the command ran on unwatched.
func TestRunKilledTakesCommand(t *testing.T) {
	tg := runTarget(t)
	cmd, _, pid := startRun(t, tg, "run", "job", "--ttl", "30s", "--", "sh", "-c", `echo $$ >&2; exec sleep 60`)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !eventually(t, 10*time.Second, func() bool { return !alive(pid) }) {
		t.Fatalf("the command %d outlived a fenced killed with SIGKILL", pid)
	}
}

// TestRunKillsGroupAfterLeaderExits: the command's first process dies of SIGTERM while a
// member of its group ignores it, with its output elsewhere; SIGKILL still reaches the group
// at the grace deadline. Before, SIGKILL was sent only if the first process was still alive.
func TestRunKillsGroupAfterLeaderExits(t *testing.T) {
	tg := runTarget(t)
	pidFile := filepath.Join(tg.dir, "side.pid")
	r := tg.run(nil, "run", "job", "--ttl", "1s", "--",
		"sh", "-c", `(trap "" TERM; while :; do sleep .1; done) >/dev/null 2>&1 & echo $! >`+pidFile+`; wait`)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	side, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-side, syscall.SIGKILL); _ = syscall.Kill(side, syscall.SIGKILL) })
	if r.code != 5 || !strings.Contains(r.stderr, "lease lost") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !eventually(t, 10*time.Second, func() bool { return !alive(side) }) {
		t.Fatalf("the group member %d that ignored SIGTERM survived the grace", side)
	}
}

// TestRunUnderNohupKeepsHangupIgnored: a fenced started with SIGHUP ignored (nohup) leaves it
// ignored, so that the hang-up nohup was asked to ignore does not stop the run. Asking the
// runtime for SIGHUP would undo the ignoring; /proc shows which it did, and the run, sent a
// SIGHUP, publishes its command's output.
func TestRunUnderNohupKeepsHangupIgnored(t *testing.T) {
	tg := runTarget(t)
	goFile := filepath.Join(tg.dir, "go")
	cmd, stderr, _ := startRunVia(t, tg, []string{"sh", "-c", `trap "" HUP; exec "$0" "$@"`},
		"run", "job", "--ttl", "30s", "--", "sh", "-c", `echo $$ >&2; while [ ! -e `+goFile+` ]; do sleep .05; done; echo published`)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	const hup = 1 << (syscall.SIGHUP - 1)
	for _, line := range strings.Split(string(status), "\n") {
		field, mask, ok := strings.Cut(line, ":\t")
		if !ok || field != "SigIgn" && field != "SigCgt" {
			continue
		}
		bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if ignored := bits&hup != 0; ignored != (field == "SigIgn") {
			t.Fatalf("fenced under nohup: %s %s; want SIGHUP ignored, not caught", field, mask)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest := new(bytes.Buffer)
	_, _ = rest.ReadFrom(stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("fenced under nohup after a SIGHUP: %v (stderr %q)", err, rest)
	}
	if st := tg.show("job"); st.PublishedGeneration == 0 {
		t.Fatalf("nothing published: %+v", st)
	}
}
