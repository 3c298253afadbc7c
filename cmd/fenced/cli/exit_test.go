package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"usage", usagef("invalid --ttl %q", "abc"), ExitUsage},
		{"wrapped usage", fmt.Errorf("publish: %w", usagef("too large")), ExitUsage},
		{"invalid", &fenced.InvalidError{Arg: "owner", Reason: "it is empty"}, ExitUsage},
		{"busy", fmt.Errorf("acquire: %w", &fenced.BusyError{Resource: "r"}), ExitBusy},
		{"not provisioned", fmt.Errorf("acquire %q: %w", "r", fenced.ErrNotProvisioned), ExitNotFound},
		{"nothing published", fmt.Errorf("get %q: %w", "r", fenced.ErrNothingPublished), ExitNotFound},
		{"refused, superseded", &fenced.RefusedError{Op: "publish", Cause: fenced.CauseSuperseded}, ExitRefused},
		{"refused, expired", &fenced.RefusedError{Op: "renew", Cause: fenced.CauseExpired}, ExitRefused},
		{"refused, not provisioned", &fenced.RefusedError{Op: "release", Cause: fenced.CauseNotProvisioned}, ExitNotFound},
		{"lease lost in run", fmt.Errorf("run %q: %w", "r", fenced.ErrLeaseLost), ExitRefused},
		{"command failed", fmt.Errorf("run: build: %w", &commandExit{code: 42, desc: "x exited with code 42"}), 42},
		{"command not started", &commandExit{code: 127, desc: "start x"}, 127},
		{"operational", fmt.Errorf("migrate: %w", errors.New("connection refused")), ExitOperational},
		{"cancelled", context.Canceled, ExitOperational},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

func TestSentence(t *testing.T) {
	got := sentence(fmt.Errorf("migrate: %w", errors.New("line one\nline two.")))
	if want := "fenced: migrate: line one line two."; got != want {
		t.Errorf("sentence = %q, want %q", got, want)
	}
	got = sentence(fmt.Errorf("acquire %q: %w", "r", fenced.ErrNotProvisioned))
	if !strings.HasPrefix(got, "fenced: ") || !strings.Contains(got, `run "fenced provision" first`) {
		t.Errorf("sentence = %q, want a hint to provision", got)
	}
}

// A run is a pass only when every resource's model check finished without a violation: one
// that did not finish is exit 1 even when no violation was found, and violations win over it.
func TestTortureVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  torture.Result
		want int
	}{
		{"clean", torture.Result{}, ExitOK},
		{"violations", torture.Result{Violations: []torture.Violation{{Resource: "r"}}}, ExitViolations},
		{"model check unfinished", torture.Result{Inconclusive: []string{"nœud 1"}}, ExitOperational},
		{"both", torture.Result{Violations: []torture.Violation{{Resource: "r"}}, Inconclusive: []string{"s"}}, ExitViolations},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := verdict(&tc.res)
			if got := exitCode(err); got != tc.want {
				t.Errorf("verdict: %v, exit %d, want %d", err, got, tc.want)
			}
			if tc.want == ExitOperational && !strings.Contains(sentence(err), `"nœud 1"`) {
				t.Errorf("%q does not name the resource", sentence(err))
			}
		})
	}
}
