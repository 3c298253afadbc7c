package torture

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A restart or bump whose event carries an error did not land: the report counts it apart
// from the ones that did, in the counts and on its "faults injected" line.
func TestFaultCountsFailedApart(t *testing.T) {
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.recs = append(h.recs,
		Record{Kind: KindEvent, Proc: "nemesis", Event: FaultRestart, Time: 30, EndTime: 40,
			Detail: "restart postgresql: exit status 1", Err: "restart postgresql: exit status 1"},
		Record{Kind: KindEvent, Proc: "nemesis", Event: FaultBump, Time: 50, EndTime: 60,
			Detail: "epoch bump: connection refused", Err: "connection refused"},
		Record{Kind: KindEvent, Proc: "nemesis", Event: FaultBump, Time: 70, EndTime: 80, Epoch: 2, Detail: "epoch bumped to 2"})
	hs := Build(h.recs, 0)
	r := &Report{Run: Run{Seed: 1, Workers: 1, Resources: []string{"r"}, Faults: []string{FaultRestart, FaultBump}},
		History: hs, Result: Check(hs, nil, 0)}
	n := r.FaultCounts()
	if n[FaultRestart] != 0 || n[FaultRestart+" failed"] != 1 || n[FaultBump] != 1 || n[FaultBump+" failed"] != 1 {
		t.Errorf("counts %v: want restart 0 (1 failed), bump 1 (1 failed)", n)
	}
	var b strings.Builder
	r.WriteText(&b)
	if want := "faults injected: restart 0 (1 more failed), bump 1 (1 more failed)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("report:\n%s\nwant the line %q", b.String(), want)
	}
}

// Every invariant of the protocol's list (1 to 15) is either checked or named, with the
// reason, among those a history cannot show: the report lists both.
func TestEveryInvariantCheckedOrNotShown(t *testing.T) {
	named := map[string]bool{}
	for _, s := range append(slices.Clone(Invariants), NotShown...) {
		n, _, _ := strings.Cut(s, " ")
		named[strings.TrimRight(n, "ab")] = true
	}
	for i := 1; i <= 15; i++ {
		if !named[strconv.Itoa(i)] {
			t.Errorf("invariant %d is neither checked nor in NotShown", i)
		}
	}
}

// A kill counts as "during an operation" when the history shows it: the killed worker's last
// CALL, made before the kill, has no RETURN. w2.1 reported its call, but wrote its RETURN
// before the signal landed; w3.1 was killed between requests.
func TestKillsDuringCallFromTheHistory(t *testing.T) {
	h := &hist{}
	h.acq("w1.1", 10, 20, "a1", 1, 1)
	h.acq("w1.1", 30, 0, "a2", 1, 2) // no RETURN: killed in flight
	h.acq("w2.1", 40, 45, "b1", 1, 3)
	h.acq("w3.1", 50, 55, "c1", 1, 4)
	kill := func(proc string, at int64, detail string) {
		h.recs = append(h.recs, Record{Kind: KindEvent, Proc: proc, Event: FaultKill, Time: at, Detail: detail})
	}
	kill("w1.1", 35, "during a acquire request")
	kill("w2.1", 46, "during a acquire request")
	kill("w3.1", 60, "untargeted: no operation was reported within 3s")
	hs := Build(h.recs, 0)
	r := &Report{History: hs}
	if n := r.killsDuringCall(); n != 1 {
		t.Errorf("kills during an operation: %d, want 1 (w1.1's)", n)
	}
}
