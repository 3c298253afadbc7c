package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The torture tests run short seeded schedules; docs/TORTURE.md records longer runs. Each
// database gets a fenced run, which must find nothing, and the same seed through a plain lock,
// which must find violations: the checker is shown able to fail.
const (
	tortureSeed     = "3"
	tortureDuration = "20s"
)

// runTorture runs fenced torture with db as FENCED_DB and returns its exit code and output.
func runTorture(t *testing.T, db string, args ...string) (int, string) {
	t.Helper()
	return runTortureIn(t, t.TempDir(), db, args...)
}

// runTortureIn is runTorture with the report written in the directory report.
func runTortureIn(t *testing.T, report, db string, args ...string) (int, string) {
	t.Helper()
	return runTortureWith(t, report, db, nil, args...)
}

// runTortureWith is runTortureIn calling during, when not nil, while the run goes on.
func runTortureWith(t *testing.T, report, db string, during func(), args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"torture", "--seed", tortureSeed, "--duration", tortureDuration,
		"--report", report}, args...)...)
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
	start := time.Now()
	err := cmd.Start()
	if err == nil {
		if during != nil {
			during()
		}
		err = cmd.Wait()
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run fenced torture: %v\n%s", err, out.String())
	}
	t.Logf("fenced torture %s took %s:\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), out.String())
	page, err := os.ReadFile(filepath.Join(report, "index.html"))
	if err != nil {
		t.Fatalf("no HTML report: %v", err)
	}
	for _, want := range []string{"<svg", "holders", "Nemesis schedule"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("the HTML report has no %q", want)
		}
	}
	if bytes.Contains(page, []byte("http://")) && !bytes.Contains(page, []byte(`xmlns="http://www.w3.org/2000/svg"`)) {
		t.Error("the HTML report refers to the network")
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// checkTortured asserts what every run must show: operations checked and faults injected.
func checkTortured(t *testing.T, out string, faults ...string) {
	t.Helper()
	if m := regexp.MustCompile(`operations: (\d+) checked`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Errorf("no operations were checked")
	}
	for _, f := range faults {
		if !regexp.MustCompile(`faults injected: .*\b` + f + ` [1-9]`).MatchString(out) {
			t.Errorf("no %s fault was injected", f)
		}
	}
}

// tortureBoth runs the fenced and the unfenced schedule in parallel, each on a store of its own
// from db: bump and restore act on the whole store's epoch, so two runs sharing one store would
// take each other's epochs back (the checker catches that as invariant 8 and tokens repeated).
func tortureBoth(t *testing.T, db func(t *testing.T) string, faults []string, args ...string) {
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		code, out := runTorture(t, db(t), args...)
		if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
			t.Fatalf("fenced torture: exit %d, want 0 and no violations", code)
		}
		checkTortured(t, out, faults...)
	})
	t.Run("unfenced", func(t *testing.T) {
		t.Parallel()
		code, out := runTorture(t, db(t), append(args, "--unfenced")...)
		if code != 7 || !regexp.MustCompile(`RESULT: \d+ violations found`).MatchString(out) {
			t.Fatalf("unfenced torture: exit %d, want 7 and violations found", code)
		}
		if !strings.Contains(out, "VIOLATED 3 fence") || !strings.Contains(out, "VIOLATION 1:") {
			t.Error("the plain lock's stale writes were not reported as fence violations with an excerpt")
		}
		checkTortured(t, out, faults...)
	})
}

func TestTortureSQLite(t *testing.T) {
	t.Parallel()
	// No --db: a temporary SQLite file, with every fault that applies to it.
	tortureBoth(t, func(*testing.T) string { return "" }, []string{"pause", "kill", "drop-reply", "clock", "bump", "restore"})
}

func TestTorturePostgres(t *testing.T) {
	t.Parallel()
	// restart is left out: the other tests share this server. bump and restore act on the
	// whole store: the schema is the test's own.
	tortureBoth(t, postgresSchema, []string{"pause", "kill", "drop-reply", "rowlock", "bump", "restore"},
		"--faults", "pause,kill,drop-reply,rowlock,bump,restore")
}

// TestTortureRestoreWithoutBump is the restore fault's control: the same copy restored without
// the epoch bump hands out tokens again, and the checker must say so.
func TestTortureRestoreWithoutBump(t *testing.T) {
	t.Parallel()
	code, out := runTorture(t, "", "--duration", "10s", "--faults", "restore,drop-reply", "--restore-without-bump")
	checkRestoreControl(t, code, out)
}

// checkRestoreControl asserts what a restore without the bump must show: repeated tokens and
// stale writes accepted (exit 7), and nothing wrong with the history itself for the model,
// which takes the restore as a legitimate rollback.
func checkRestoreControl(t *testing.T, code int, out string) {
	t.Helper()
	if code != 7 || !strings.Contains(out, "VIOLATED 1 unique tokens") || !strings.Contains(out, "VIOLATED 3 fence") {
		t.Fatalf("restore without a bump: exit %d, want 7 with repeated tokens and accepted stale writes", code)
	}
	if strings.Contains(out, "VIOLATED model") {
		t.Error("the model must take the restore as a legitimate rollback")
	}
	checkTortured(t, out, "restore")
}

// TestTortureInterrupted: Ctrl-C stops the workers, and the report is still written.
func TestTortureInterrupted(t *testing.T) {
	t.Parallel()
	report := t.TempDir()
	cmd := exec.Command(bin, "torture", "--seed", tortureSeed, "--duration", "60s", "--report", report, "--faults", "pause,kill")
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCED_DB=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The barrier: a worker has recorded an acknowledged operation.
	deadline := time.Now().Add(time.Minute)
	for {
		files, _ := filepath.Glob(filepath.Join(report, "history", "w*.jsonl"))
		done := false
		for _, f := range files {
			b, _ := os.ReadFile(f)
			done = done || bytes.Contains(b, []byte(`"k":"return"`))
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("no worker recorded an operation within a minute:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling for the barrier
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	t.Logf("interrupted torture:\n%s", out.String())
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit %d, want 1 (interrupted)", code)
	}
	for _, want := range []string{"interrupted after", "RESULT: no violations found", "report written"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output has no %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(report, "index.html")); err != nil {
		t.Errorf("no HTML report: %v", err)
	}
	nem, err := os.ReadFile(filepath.Join(report, "history", "nemesis.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`"pid":(\d+)`).FindAllSubmatch(nem, -1) {
		pid, _ := strconv.Atoi(string(m[1]))
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker process %d still runs after the interruption", pid)
		}
	}
}

func TestTortureUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"torture", "--duration", "1s"},
		{"torture", "--workers", "0"},
		{"torture", "--faults", "pause,bogus"},
		{"torture", "--faults", ",,"},
		{"torture", "--duration", "soon"},
		{"torture", "--duration", "-1s"},
		{"torture", "--workers", "65"},
		{"torture", "--resources", "0"},
		{"torture", "--seed", "-3"},
		{"torture", "--check-timeout", "0s"},
		{"torture", "--report", "/etc/passwd"},
		{"torture", "--restore-without-bump", "--faults", "pause"},
		{"torture", "--faults", "restart"},                                                      // SQLite: no server
		{"torture", "--faults", "rowlock,pause"},                                                // SQLite: no row locks
		{"torture", "--restore-cmd", "true", "--faults", "restore"},                             // SQLite: its own copy
		{"--db", "etcd://127.0.0.1:1", "torture", "--restore-cmd", "true"},                      // restore not named
		{"--db", "etcd://127.0.0.1", "torture", "--restore-cmd", "true", "--faults", "restore"}, // no port to wait for
		{"--db", "etcd://127.0.0.1:1", "torture", "--faults", "restore"},
		{"--db", "etcd://127.0.0.1:1", "torture", "--faults", "clock"},
		{"torture", "--resources", "101"},
		{"torture", "--workers", "many"},
		{"torture", "--check-timeout", "-1s"},
		{"torture", "--faults", "partition"},
		{"torture", "--faults", "loss"},
		{"--db", "redis://127.0.0.1:1/0", "torture", "--faults", "loss"}, // no --partition-dev
		{"torture", "--faults", "delay"},                                 // SQLite: no network
		{"--db", "postgres:///x?host=/var/run/postgresql", "torture", "--faults", "delay"},
		{"torture", "--partition-dev", "lo"},
		{"torture", "--restart-cmd", "true"},
		{"torture", "--mutant", "bogus"},
		{"torture", "--faults", "none", "--restore-without-bump"},
		{"--db", "redis://127.0.0.1:1/0", "torture", "--partition-dev", "no-such-dev0"},
		{"--db", "redis://127.0.0.1:1/0", "torture", "--faults", "restart"},
		{"--db", "etcd://127.0.0.1", "torture", "--restart-cmd", "true"},
		{"torture", "extra-argument"},
	} {
		r := runIn(t, dir, "", nil, args...)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("fenced %s: exit %d, want 2 and one sentence (stderr %q)", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	// A fault that cannot be injected on the chosen engine is refused by the fault's name and
	// the engine's.
	for args, want := range map[string]string{
		"torture --faults restart":                                        "the restart fault does not apply to SQLite",
		"torture --faults rowlock,pause":                                  "the rowlock fault does not apply to SQLite",
		"torture --faults partition":                                      "the partition fault does not apply to SQLite",
		"torture --faults delay,pause":                                    "the delay fault does not apply to SQLite",
		"--db redis://127.0.0.1:1/0 torture --faults loss":                "the loss fault does not apply to Redis: needs --partition-dev",
		"--db postgres:///x?host=/tmp torture --faults delay":             "the delay fault does not apply to PostgreSQL: the database URL names no host",
		"--db postgres://127.0.0.1:1/x torture --faults clock":            "the clock fault does not apply to PostgreSQL",
		"--db mysql://root@127.0.0.1:1/x torture --faults pause,clock":    "the clock fault does not apply to MariaDB",
		"--db redis://127.0.0.1:1/0 torture --faults restart":             "the restart fault does not apply to Redis",
		"--db redis://127.0.0.1:1/0 torture --faults rowlock":             "the rowlock fault does not apply to Redis",
		"--db etcd://127.0.0.1:1 torture --faults restore":                "the restore fault does not apply to etcd: needs --restore-cmd",
		"torture --restore-cmd true --faults restore":                     "--restore-cmd: it applies to etcd only",
		"--db etcd://127.0.0.1:1 torture --faults clock":                  "the clock fault does not apply to etcd",
		"--db redis://127.0.0.1:1/0 torture --partition-dev no-such-dev0": "no such network interface",
	} {
		if r := runIn(t, dir, "", nil, strings.Fields(args)...); !strings.Contains(r.stderr, want) {
			t.Errorf("fenced %s: %q does not say %q", args, r.stderr, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "fenced.db")); err == nil {
		t.Error("torture created ./fenced.db")
	}
}

// TestTortureGate drives writes through a participating service's gate too: fenced on
// acquisition it accepts no stale write; with --unfenced (no fence, the high-water mark alone)
// the checker must find writes the service accepted from a holder already superseded.
func TestTortureGate(t *testing.T) {
	t.Parallel()
	gateLine := regexp.MustCompile(`(ok|VIOLATED) +3 at a participating service \(--gate\) or an Azure blob.* \((\d+) checked, (\d+) violations\)`)
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		code, out := runTorture(t, "", "--gate")
		if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
			t.Fatalf("torture --gate: exit %d, want 0 and no violations", code)
		}
		if m := gateLine.FindStringSubmatch(out); m == nil || m[1] != "ok" || m[2] == "0" {
			t.Errorf("the gate's writes were not checked: %q", m)
		}
		if !regexp.MustCompile(`fence +ok [1-9]`).MatchString(out) {
			t.Error("no worker fenced the gate")
		}
		checkTortured(t, out, "pause")
	})
	t.Run("unfenced", func(t *testing.T) {
		t.Parallel()
		// A stale write reaches the gate only when a pause lands between a worker's acquisition
		// and its write, which a short run does not always schedule: other seeds (pauses only)
		// are tried until one does, and the test fails if none of them does.
		var m []string
		for _, seed := range []string{"3", "4", "5", "6"} {
			code, out := runTorture(t, "", "--gate", "--unfenced", "--seed", seed, "--faults", "pause")
			if code != 7 {
				t.Fatalf("torture --gate --unfenced --seed %s: exit %d, want 7", seed, code)
			}
			if strings.Contains(out, "\n  fence ") {
				t.Fatal("unfenced workers fenced the gate")
			}
			if m = gateLine.FindStringSubmatch(out); m != nil && m[1] == "VIOLATED" {
				return
			}
		}
		t.Errorf("the gate's stale writes were not reported with any seed: %q", m)
	})
}

// TestTortureFirstPauseLate holds back every request of the run, workers' and reader's alike,
// until after the run's planned end (the barrier the restore fault uses, taken before the run
// starts), as a machine too loaded for the workers to get going before the nemesis's first
// pause would: that pause, planned at 1.65 s and given up after 3 s by a nemesis that aims by
// time alone, must still land, the run going on past its end until it has.
func TestTortureFirstPauseLate(t *testing.T) {
	t.Parallel()
	report := t.TempDir()
	barrier, err := os.OpenFile(filepath.Join(report, "barrier"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer barrier.Close()
	if err := syscall.Flock(int(barrier.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	const duration = 6 * time.Second // seed 3 plans one pause in 6s: at 1.65s
	code, out := runTortureWith(t, report, "", func() {
		// The first worker's start is recorded after the run's start: a release duration and
		// one second after it is seen comes after the run's planned end.
		nemesis := filepath.Join(report, "history", "nemesis.jsonl")
		for {
			b, _ := os.ReadFile(nemesis)
			if bytes.Contains(b, []byte(`"event":"start"`)) {
				break
			}
			time.Sleep(10 * time.Millisecond) // polling a file another process writes
		}
		time.Sleep(duration + time.Second) // past the planned end; the order, not a hope
		_ = syscall.Flock(int(barrier.Fd()), syscall.LOCK_UN)
	}, "--faults", "pause", "--duration", duration.String())
	if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
		t.Fatalf("torture: exit %d, want 0 and no violations", code)
	}
	checkTortured(t, out, "pause")
	nemesis, err := os.ReadFile(filepath.Join(report, "history", "nemesis.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(nemesis, []byte(`"event":"extend"`)) {
		t.Error("the run was not recorded as extended past its planned end")
	}
}

// TestTortureMutants plants the bugs the clock checks are about in the workers' driver and runs
// real processes on SQLite: a renewal without the expiry condition (one worker, so that nobody
// takes a paused worker's lease over; every lease is renewed after the build's first half,
// which a pause stretches past the expiry) and busy answers for expired leases (killed and
// paused workers leave them). Only the clock checks can see either.
func TestTortureMutants(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mutant, want string
		args         []string
	}{
		{"renew-after-expiry", "VIOLATED 6 no renewal is accepted at or after its lease's expiry", []string{"--workers", "1", "--faults", "pause"}},
		{"busy-after-expiry", "VIOLATED 14 liveness", []string{"--faults", "pause,kill"}},
	} {
		t.Run(tc.mutant, func(t *testing.T) {
			t.Parallel()
			code, out := runTorture(t, "", append([]string{"--duration", "12s", "--mutant", tc.mutant}, tc.args...)...)
			if code != 7 || !strings.Contains(out, tc.want) {
				t.Fatalf("mutant %s: exit %d, want 7 and %q", tc.mutant, code, tc.want)
			}
		})
	}
}
