//go:build unix

package cli_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDemoInterrupted stops the demo with SIGTERM while worker A is suspended: the demo must
// exit 1 with one sentence, kill and reap its workers and remove its temporary directory.
func TestDemoInterrupted(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(bin, "demo")
	cmd.Dir = t.TempDir()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()

	// Read the timeline up to the suspension of A: the barrier, rather than a sleep.
	var dir string
	pid := 0
	sc := bufio.NewScanner(stdout)
	for pid == 0 && sc.Scan() {
		line := sc.Text()
		if m := regexp.MustCompile(`SQLite in (\S+)`).FindStringSubmatch(line); m != nil {
			dir = m[1]
		}
		if m := regexp.MustCompile(`SIGSTOP A \(pid (\d+)\)`).FindStringSubmatch(line); m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
	}
	if pid == 0 || dir == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the demo never reported suspending worker A (stderr %q)", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("interrupted demo: %v, want exit code 1 (stderr %q)", err, stderr.String())
	}
	checkSentence(t, stderr.String())
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("worker A (pid %d) outlived the demo: kill -0 returned %v", pid, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the demo left %s behind (%v)", dir, err)
	}
}
