package cli

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/driver"
)

// heldCopy is a store copy that always succeeds and holds one empty resource.
type heldCopy struct{}

func (heldCopy) take(context.Context) (map[string]torture.State, error) {
	return map[string]torture.State{"r": {Epoch: 1}}, nil
}
func (heldCopy) restore(context.Context) error { return nil }
func (heldCopy) drop(context.Context)          {}

// unbumpable is a driver whose epoch bump fails.
type unbumpable struct{ driver.Driver }

func (unbumpable) BumpEpoch(context.Context) (int64, error) {
	return 0, errors.New("permission denied for table fenced_meta")
}

// A restore whose bump failed says so on the timeline, and the bump is recorded as failed:
// the note must not claim a bump that did not happen.
func TestRestoreNoteSaysTheBumpOnlyWhenMade(t *testing.T) {
	dir := t.TempDir()
	rec, err := torture.NewRecorder(filepath.Join(dir, "nemesis.jsonl"), "nemesis")
	if err != nil {
		t.Fatal(err)
	}
	barrier, err := torture.OpenBarrier(filepath.Join(dir, "barrier"))
	if err != nil {
		t.Fatal(err)
	}
	defer barrier.Close()
	run := &tortureRun{nem: rec, resources: []string{"r"}, copier: heldCopy{}, barrier: barrier, drv: unbumpable{}}
	run.restoreFault(context.Background(), torture.Fault{Kind: torture.FaultRestore})
	_ = rec.Close()
	h, err := torture.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var restore, bump *torture.Record
	for i := range h.Events {
		switch h.Events[i].Event {
		case torture.FaultRestore:
			restore = &h.Events[i]
		case torture.FaultBump:
			bump = &h.Events[i]
		}
	}
	if restore == nil || bump == nil {
		t.Fatalf("events %+v, want a restore and a bump", h.Events)
	}
	if strings.Contains(restore.Detail, "then the epoch bumped") || !strings.Contains(restore.Detail, "bump after it FAILED") {
		t.Errorf("restore's note %q: want it to say the bump failed", restore.Detail)
	}
	if bump.Err == "" {
		t.Errorf("bump event %+v: want its error recorded", bump)
	}
}
