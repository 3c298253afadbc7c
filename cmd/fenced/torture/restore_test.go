package torture

import (
	"strings"
	"testing"
)

// Histories with the nemesis's copy, restore and bump, and with the engine's clock in the
// replies: each new check is shown passing a valid history and catching the planted bug.

func (h *hist) acq(proc string, call, ret int64, owner string, epoch, gen int64) {
	h.op(proc, call, ret, Record{Op: OpAcquire, Owner: owner, TTLMs: 500}, Record{Out: OutOK, Epoch: epoch, Gen: gen})
}

func (h *hist) pub(proc string, call, ret int64, owner string, epoch, gen int64, payload, out string) {
	h.op(proc, call, ret, Record{Op: OpPublishRelease, Owner: owner, Epoch: epoch, Gen: gen, Payload: payload}, Record{Out: out})
}

func (h *hist) snapshot(call, ret int64, epoch, gen int64, owner string, pub int64, payload string) {
	h.op("nemesis", call, ret, Record{Op: OpSnapshot},
		Record{Out: OutOK, StoreEpoch: epoch, Gen: gen, ReadOwner: owner, ReadPub: pub, Payload: payload})
}

func (h *hist) restore(call, ret int64, epoch, gen int64, owner string, pub int64, payload string) {
	h.op("nemesis", call, ret, Record{Op: OpRestore, StoreEpoch: epoch, Gen: gen, Owner: owner, ReadPub: pub, Payload: payload},
		Record{Out: OutOK})
}

func (h *hist) bump(call, ret int64, epoch int64) {
	h.op("nemesis", call, ret, Record{Op: OpBump}, Record{Out: OutOK, Epoch: epoch})
}

// restored: generation 1 published and copied; generation 2 acquired and published; the copy
// restored (generation 1 again); then, when bump is set, the epoch bumped before anyone goes on.
func restored(bump bool) *hist {
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.pub("A", 30, 40, "a1", 100, 1, "p-a1", OutOK)
	h.snapshot(50, 60, 100, 1, "", 1, "p-a1")
	h.acq("B", 70, 80, "b1", 100, 2)
	h.pub("B", 90, 100, "b1", 100, 2, "p-b1", OutOK)
	h.get("R", 110, 120, 2, "p-b1")
	h.restore(130, 140, 100, 1, "", 1, "p-a1")
	epoch := int64(100)
	if bump {
		h.bump(150, 160, 200)
		epoch = 200
	}
	h.get("R", 170, 180, 1, "p-a1") // the restore rolled the publication back: legitimate
	h.acq("C", 190, 200, "c1", epoch, 2)
	h.pub("C", 210, 220, "c1", epoch, 2, "p-c1", OutOK)
	h.get("R", 230, 240, 2, "p-c1")
	return h
}

func TestRestoreThenBumpIsValid(t *testing.T) {
	r := restored(true).check(t)
	if !r.OK() || len(r.Inconclusive) != 0 {
		t.Fatal("a restore followed by a bump was flagged")
	}
}

func TestRestoreWithoutBumpFlagged(t *testing.T) {
	r := restored(false).check(t)
	wantViolated(t, r, InvUniqueTokens, InvRealTimeOrder, InvOnePublication)
	for _, v := range r.Violations {
		if v.Invariant == InvLinearizable {
			t.Errorf("the model must take the restore as a legitimate rollback: %s", v.Message)
		}
	}
}

func TestStaleEpochAfterBumpFlagged(t *testing.T) {
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.bump(30, 40, 200)
	h.pub("A", 50, 60, "a1", 100, 1, "stale", OutOK) // accepted: the bump did not fence it
	r := h.check(t)
	wantViolated(t, r, InvBumpFences, InvLinearizable)

	h = &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.bump(30, 40, 200)
	h.pub("A", 50, 60, "a1", 100, 1, "stale", OutRefused)
	h.acq("B", 70, 80, "b1", 100, 2) // granted the old epoch after the bump
	r = h.check(t)
	wantViolated(t, r, InvBumpFences, InvLinearizable)
}

// TestBumpBelowAnEarlierBumpFlagged: a restore takes the epoch back to the copy's, and the
// bump after it raises it above the copy's but not to the largest epoch already acknowledged;
// an acquisition granted that epoch afterwards is older than a bump acknowledged before its
// call. The model allows it (each bump raises the epoch it finds); only the bump check's
// largest epoch, not the latest bump's, sees it.
func TestBumpBelowAnEarlierBumpFlagged(t *testing.T) {
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.snapshot(30, 40, 100, 1, "a1", 0, "")
	h.bump(50, 60, 300)
	h.restore(70, 80, 100, 1, "", 0, "")
	h.bump(90, 100, 200)
	h.acq("B", 110, 120, "b1", 200, 2)
	r := h.check(t)
	wantViolated(t, r, InvBumpFences)
}

func TestSnapshotMustMatchAState(t *testing.T) {
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.snapshot(30, 40, 100, 5, "a1", 0, "") // generation 5 never existed
	r := h.check(t)
	wantViolated(t, r, InvLinearizable)
}

// The engine's clock in microseconds; the history's in nanoseconds.
func TestRenewAfterExpiryFlagged(t *testing.T) {
	for _, tc := range []struct {
		name     string
		renewAt  int64 // engine µs
		violated bool
	}{{"in time", 900_000, false}, {"after expiry", 1_400_000, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := &hist{}
			h.op("A", 10, 20, Record{Op: OpAcquire, Owner: "a1", TTLMs: 500},
				Record{Out: OutOK, Epoch: 100, Gen: 1, LeaseUntilUs: 1_000_000})
			h.op("A", 30, 40, Record{Op: OpRenew, Owner: "a1", Epoch: 100, Gen: 1, TTLMs: 500},
				Record{Out: OutOK, LeaseUntilUs: tc.renewAt + 500_000})
			r := h.check(t)
			if tc.violated {
				wantViolated(t, r, InvRenewClock)
				if !strings.Contains(r.Violations[0].Message, "400ms after the lease expired") {
					t.Errorf("message: %s", r.Violations[0].Message)
				}
			} else if !r.OK() {
				t.Fatal("a renewal in time was flagged")
			}
		})
	}
}

func TestBusyAfterExpiryFlagged(t *testing.T) {
	const ms = int64(1_000_000) // ns
	for _, tc := range []struct {
		name        string
		holderUntil int64 // engine µs
		violated    bool
	}{{"holder alive", 6_100_000, false}, {"within the bound", 5_990_000, false}, {"expired long before", 5_500_000, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := &hist{}
			// The engine's clock reads 5.000s while the history's is between 1000ms and 1001ms.
			h.op("R", 1000*ms, 1001*ms, Record{Op: OpShow}, Record{Out: OutOK, NowUs: 5_000_000})
			h.op("A", 2000*ms, 2002*ms, Record{Op: OpAcquire, Owner: "a1", TTLMs: 500},
				Record{Out: OutBusy, LeaseUntilUs: tc.holderUntil})
			r := h.check(t)
			if tc.violated {
				wantViolated(t, r, InvLiveness)
			} else if !r.OK() {
				t.Fatal("a busy answer for a live lease was flagged")
			}
			for _, inv := range r.Invariants {
				if inv.Name == InvLiveness && inv.Checked != 1 {
					t.Errorf("liveness checked %d answers, want 1", inv.Checked)
				}
			}
		})
	}
}

// A reply thrown away by drop-reply keeps its interval (the database had answered before the
// RETURN record); a killed request or a driver error may still take effect until the end.
func TestDroppedReplyKeepsItsInterval(t *testing.T) {
	recs := []Record{
		{Kind: KindCall, Proc: "A", ID: 1, Time: 10, Op: OpAcquire, Resource: "r", Owner: "a1"},
		{Kind: KindNote, Proc: "A", ID: 1, Time: 15, Event: "drop", Detail: "acquire reply dropped; the database had answered ok"},
		{Kind: KindReturn, Proc: "A", ID: 1, Time: 20, Out: OutUnknown, Err: "reply dropped"},
		{Kind: KindCall, Proc: "B", ID: 1, Time: 30, Op: OpAcquire, Resource: "r", Owner: "b1"},
		{Kind: KindReturn, Proc: "B", ID: 1, Time: 40, Out: OutUnknown, Err: "connection reset"},
		{Kind: KindCall, Proc: "C", ID: 1, Time: 50, Op: OpAcquire, Resource: "r", Owner: "c1"},
	}
	h := Build(recs, 0)
	want := map[string]int64{"A": 20, "B": h.End, "C": h.End}
	for _, op := range h.Ops {
		if !op.Unknown() || op.Return != want[op.Proc] {
			t.Errorf("%s: unknown %v, return %d, want %d", op.Proc, op.Unknown(), op.Return, want[op.Proc])
		}
	}
}

// restartedRedis: A holds generation 1 across a restart of a server that bumps its epoch by
// itself at its first lease-carrying request (Redis); A's publication and release, after the
// restart, are refused, as the bump freed the lease, before anyone acquires again. selfBump
// says whether the restart event records that bump.
func restartedRedis(selfBump bool) *hist {
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	h.recs = append(h.recs, Record{Kind: KindEvent, Proc: "nemesis", Event: FaultRestart, Time: 30, EndTime: 40,
		SelfBump: selfBump, Detail: "server restarted"})
	h.write("A", 50, 60, OpPublish, "a1", 1, "p-a1", OutRefused)
	h.write("A", 70, 80, OpRelease, "a1", 1, "", OutRefused)
	h.acq("B", 90, 100, "b1", 300, 2)
	h.pub("B", 110, 120, "b1", 300, 2, "p-b1", OutOK)
	h.get("R", 130, 140, 2, "p-b1")
	return h
}

// TestRestartSelfBumpFreesLeases: the model knows that Redis's own bump after a restart
// freed the lease held across it (the refused release above was once reported as a
// violation); on an engine that does not bump at a restart, the same refusal is still one.
func TestRestartSelfBumpFreesLeases(t *testing.T) {
	if r := restartedRedis(true).check(t); !r.OK() || len(r.Inconclusive) != 0 {
		t.Fatal("a release refused after the engine's own bump was flagged")
	}
	r := restartedRedis(false).check(t)
	wantViolated(t, r, InvLinearizable)
}

// TestRestartSelfBumpStillFences: after the engine's own bump, a write carrying the lease
// from before the restart must not be accepted; nor may the release of a lease acquired
// after the bump be refused. C's refusal, a definite answer of a lease-carrying request
// called after the restart, shows that the bump was done by its return.
func TestRestartSelfBumpStillFences(t *testing.T) {
	restart := func(h *hist) {
		h.recs = append(h.recs, Record{Kind: KindEvent, Proc: "nemesis", Event: FaultRestart, Time: 30, EndTime: 40,
			SelfBump: true, Detail: "server restarted"})
		h.op("C", 50, 60, Record{Op: OpRelease, Owner: "c0", Epoch: 100, Gen: 7}, Record{Out: OutRefused})
	}
	h := &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	restart(h)
	h.op("A", 70, 80, Record{Op: OpPublish, Owner: "a1", Epoch: 100, Gen: 1, Payload: "stale"}, Record{Out: OutOK})
	wantViolated(t, h.check(t), InvLinearizable)

	h = &hist{}
	h.acq("A", 10, 20, "a1", 100, 1)
	restart(h)
	h.acq("B", 70, 80, "b1", 300, 2)
	h.op("B", 90, 100, Record{Op: OpRelease, Owner: "b1", Epoch: 300, Gen: 2}, Record{Out: OutRefused})
	wantViolated(t, h.check(t), InvLinearizable)
}
