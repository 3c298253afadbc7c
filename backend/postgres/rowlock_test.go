package postgres

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The conformance suite must be able to fail: with FENCED_MUTANT=no-row-lock the renewal and
// the publication run without sqlLockRow first, as before the fix, in both modes (the
// routines Migrate installs are built from the same, mutated, definitions).
func init() {
	if os.Getenv("FENCED_MUTANT") != "no-row-lock" {
		return
	}
	rtRenew.lockFirst, rtPublish.lockFirst, rtPublishAndRelease.lockFirst = false, false, false
	for i := range routines {
		routines[i].lockFirst = false
	}
}

// TestSuiteCatchesClockBeforeRowLock runs RowLockAcrossExpiry in a child process against the
// statements without the row lock first, directly and as a granted role: it must fail, for
// both lock modes (PostgreSQL re-checks the condition after the wait in neither).
func TestSuiteCatchesClockBeforeRowLock(t *testing.T) {
	if os.Getenv("FENCED_MUTANT") != "" {
		t.Skip("running as a mutant child")
	}
	testSchema(t, nil) // skips loudly without a server
	for _, run := range []string{"^TestConformance$/^RowLockAcrossExpiry$", "^TestConformanceAsGrantedRole$/^read-committed$/^RowLockAcrossExpiry$"} {
		t.Run(run, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run", run, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "FENCED_MUTANT=no-row-lock")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("RowLockAcrossExpiry passed against statements that read the clock before the row lock:\n%s", out)
			}
			// Whichever of the two gets the lock first acts on the expired lease; the other
			// may then see the row it changed, so only one is certain to be accepted.
			for _, mode := range []string{"LockOnly", "UpdateThenRollback"} {
				want := "that waited on the row lock (" + mode + ") until after the lease expired was accepted"
				if !strings.Contains(string(out), want) {
					t.Errorf("the child did not report %q:\n%s", want, out)
				}
			}
		})
	}
}
