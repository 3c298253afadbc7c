package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	report := t.TempDir()
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
	err := cmd.Run()
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

func tortureBoth(t *testing.T, db string, faults []string, args ...string) {
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		code, out := runTorture(t, db, args...)
		if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
			t.Fatalf("fenced torture: exit %d, want 0 and no violations", code)
		}
		checkTortured(t, out, faults...)
	})
	t.Run("unfenced", func(t *testing.T) {
		t.Parallel()
		code, out := runTorture(t, db, append(args, "--unfenced")...)
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
	tortureBoth(t, "", []string{"pause", "kill", "drop-reply", "clock"})
}

func TestTorturePostgres(t *testing.T) {
	t.Parallel()
	// restart is left out: the other tests share this server.
	tortureBoth(t, postgresSchema(t), []string{"pause", "kill", "drop-reply", "rowlock"}, "--faults", "pause,kill,drop-reply,rowlock")
}

func TestTortureUsage(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"torture", "--duration", "1s"},
		{"torture", "--workers", "0"},
		{"torture", "--faults", "pause,bogus"},
		{"--db", "redis://127.0.0.1:1/0", "torture", "--unfenced", "--duration", "3s"},
	} {
		r := runIn(t, dir, "", nil, args...)
		if r.code != 2 {
			t.Errorf("fenced %s: exit %d, want 2 (stderr %q)", strings.Join(args, " "), r.code, r.stderr)
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
	gateLine := regexp.MustCompile(`(ok|VIOLATED) +3 at a participating service \(--gate\).* \((\d+) checked, (\d+) violations\)`)
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
		code, out := runTorture(t, "", "--gate", "--unfenced")
		if code != 7 {
			t.Fatalf("torture --gate --unfenced: exit %d, want 7", code)
		}
		if m := gateLine.FindStringSubmatch(out); m == nil || m[1] != "VIOLATED" {
			t.Errorf("the gate's stale writes were not reported: %q", m)
		}
		if strings.Contains(out, "\n  fence ") {
			t.Error("unfenced workers fenced the gate")
		}
	})
}
