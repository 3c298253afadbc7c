package torture

import (
	"reflect"
	"testing"
	"time"
)

func TestPlanFollowsTheSeed(t *testing.T) {
	faults := []string{FaultPause, FaultKill, FaultDropReply, FaultClock, FaultRowLock}
	a := Plan(3, time.Minute, 4, faults)
	if !reflect.DeepEqual(a, Plan(3, time.Minute, 4, faults)) {
		t.Fatal("the same seed gave two plans")
	}
	if reflect.DeepEqual(a, Plan(4, time.Minute, 4, faults)) {
		t.Fatal("two seeds gave the same plan")
	}
	offset := int64(0)
	for _, f := range a {
		switch f.Kind {
		case FaultPause:
			if f.For <= TTLMax {
				t.Errorf("%s: a pause must outlast the longest TTL %s", f, TTLMax)
			}
		case FaultClock:
			if (offset == 0) == (f.OffsetMs == 0) {
				t.Errorf("%s: the clock must jump away and back in turn", f)
			}
			offset = f.OffsetMs
		case FaultKill, FaultRowLock:
		default:
			t.Errorf("%s: not asked for", f)
		}
		if f.At >= time.Minute || f.Slot < 0 || f.Slot >= 4 {
			t.Errorf("%s: outside the run", f)
		}
	}
	seen := map[string]bool{}
	for _, f := range a[:4] {
		seen[f.Kind] = true
	}
	if len(seen) != 4 {
		t.Errorf("the first four faults are not the four kinds asked for: %v", a[:4])
	}
	if len(Plan(3, time.Minute, 4, []string{FaultDropReply})) != 0 {
		t.Error("drop-reply alone needs no nemesis action")
	}
	if WorkerSeed(3, 1001) == WorkerSeed(3, 1002) {
		t.Error("worker seeds are not distinct")
	}
	// Stable across runs and releases: a recorded seed must replay the same workers.
	if got, want := WorkerSeed(3, 1001), uint64(4596970262848768757); got != want {
		t.Errorf("WorkerSeed(3, 1001) = %d, want %d", got, want)
	}
}

func TestParseFaults(t *testing.T) {
	if got, err := ParseFaults(" pause,kill,pause,"); err != nil || !reflect.DeepEqual(got, []string{"pause", "kill"}) {
		t.Errorf("ParseFaults = %v, %v", got, err)
	}
	if _, err := ParseFaults("pause,bogus"); err == nil {
		t.Error("an unknown fault was accepted")
	}
}
