package fenced

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/driver"
)

// TestIncarnationAndReadOnlyErrors: a changed incarnation is said once with both incarnations,
// is a refusal for a lease (never for an acquisition), and keeps the driver's error reachable;
// a read-only server and a certain failure say so without the word "not applied".
func TestIncarnationAndReadOnlyErrors(t *testing.T) {
	drv := driver.NotApplied(&driver.IncarnationError{Server: "77/2", Recorded: "77/1"})
	for _, op := range []string{opAcquire, opPublish, opRenew, opRelease} {
		err := mutationError(op, "r é", drv, nil)
		msg := err.Error()
		if strings.Count(msg, "restored or promoted") != 1 || !strings.Contains(msg, "77/2") || !strings.Contains(msg, "77/1") {
			t.Errorf("%s: %q, want the cause once and both incarnations", op, msg)
		}
		if !errors.Is(err, ErrIncarnationChanged) || !errors.Is(err, driver.ErrIncarnationChanged) || !errors.Is(err, driver.ErrNotApplied) {
			t.Errorf("%s: %v does not match the incarnation sentinels and not applied", op, err)
		}
		if refused := errors.Is(err, ErrRefused); refused != (op != opAcquire) {
			t.Errorf("%s: matches ErrRefused = %v", op, refused)
		}
	}

	pgErr := errors.New("ERROR: cannot execute UPDATE in a read-only transaction (SQLSTATE 25006)")
	err := mutationError(opPublish, "r", driver.ReadOnly(pgErr), nil)
	if want := `publish "r": ` + ErrReadOnly.Error(); err.Error() != want {
		t.Errorf("read-only: %q, want %q", err, want)
	}
	if !errors.Is(err, ErrReadOnly) || !errors.Is(err, driver.ErrNotApplied) || !errors.Is(err, pgErr) {
		t.Errorf("read-only: %v does not match ErrReadOnly, not applied and the engine's error", err)
	}

	err = mutationError("bump epoch", "", driver.NotApplied(fmt.Errorf("connection refused")), nil)
	if msg := err.Error(); strings.Contains(msg, "not applied") || strings.Contains(msg, `""`) || !errors.Is(err, driver.ErrNotApplied) {
		t.Errorf("not applied: %q, want no internal word and no empty resource, still matching ErrNotApplied", msg)
	}
}
