package torture

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hist writes histories by hand: each op is a call and, unless ret is 0, a return.
type hist struct {
	recs []Record
	ids  map[string]int64
}

func (h *hist) op(proc string, call, ret int64, c, r Record) {
	if h.ids == nil {
		h.ids = map[string]int64{}
	}
	h.ids[proc]++
	id := h.ids[proc]
	c.Kind, c.Proc, c.ID, c.Time = KindCall, proc, id, call
	if c.Resource == "" {
		c.Resource = "r"
	}
	h.recs = append(h.recs, c)
	if ret != 0 {
		r.Kind, r.Proc, r.ID, r.Time = KindReturn, proc, id, ret
		h.recs = append(h.recs, r)
	}
}

func (h *hist) acquire(proc string, call, ret int64, owner, out string, gen int64) {
	h.op(proc, call, ret, Record{Op: OpAcquire, Owner: owner, TTLMs: 500}, Record{Out: out, Gen: gen})
}

func (h *hist) write(proc string, call, ret int64, kind, owner string, gen int64, payload, out string) {
	h.op(proc, call, ret, Record{Op: kind, Owner: owner, Gen: gen, Payload: payload}, Record{Out: out})
}

func (h *hist) show(proc string, call, ret int64, gen int64, owner string, pub int64, bytes int64) {
	h.op(proc, call, ret, Record{Op: OpShow}, Record{Out: OutOK, Gen: gen, ReadOwner: owner, ReadPub: pub, PayloadBytes: bytes})
}

func (h *hist) get(proc string, call, ret int64, pub int64, payload string) {
	h.op(proc, call, ret, Record{Op: OpGet}, Record{Out: OutOK, ReadPub: pub, Payload: payload})
}

func (h *hist) check(t *testing.T) *Result {
	t.Helper()
	r := Check(Build(h.recs, 0), nil, 30*time.Second)
	for _, v := range r.Violations {
		t.Logf("violation: %s: %s (involved %v, excerpt %v)", v.Invariant, v.Message, v.Involved, v.Excerpt)
	}
	return r
}

func wantViolated(t *testing.T, r *Result, invariants ...string) {
	t.Helper()
	for _, inv := range invariants {
		found := false
		for _, v := range r.Violations {
			found = found || v.Invariant == inv
		}
		if !found {
			t.Errorf("%q was not reported violated", inv)
		}
	}
}

// valid is A acquiring, publishing and releasing; B taking over while A's later, stale
// publication is refused; reads along the way.
func valid() *hist {
	h := &hist{}
	h.acquire("A", 10, 20, "a1", OutOK, 1)
	h.write("A", 30, 40, OpPublish, "a1", 1, "p-a1", OutOK)
	h.write("A", 50, 60, OpRelease, "a1", 1, "", OutOK)
	h.show("R", 65, 70, 1, "", 1, 4)
	h.acquire("A", 100, 110, "a2", OutOK, 2)
	h.acquire("B", 105, 115, "b1", OutBusy, 0)
	h.acquire("B", 200, 210, "b2", OutOK, 3) // A's generation 2 expired meanwhile
	h.write("A", 220, 230, OpPublish, "a2", 2, "p-a2", OutRefused)
	h.write("B", 240, 250, OpPublishRelease, "b2", 3, "p-b2", OutOK)
	h.write("A", 260, 270, OpRelease, "a2", 2, "", OutRefused)
	h.get("R", 280, 290, 3, "p-b2")
	h.show("R", 300, 310, 3, "", 3, 4)
	return h
}

func TestValidHistoryPasses(t *testing.T) {
	r := valid().check(t)
	if !r.OK() || len(r.Inconclusive) != 0 {
		t.Fatalf("a valid history was flagged")
	}
	if r.Ops != 12 || r.Unknown != 0 {
		t.Errorf("ops %d unknown %d", r.Ops, r.Unknown)
	}
}

func TestStalePublishFlagged(t *testing.T) {
	h := &hist{}
	h.acquire("A", 10, 20, "a1", OutOK, 1)
	h.acquire("B", 100, 110, "b1", OutOK, 2)
	h.write("A", 120, 130, OpPublish, "a1", 1, "stale", OutOK) // accepted: the fence failed
	h.get("R", 140, 150, 1, "stale")
	r := h.check(t)
	wantViolated(t, r, InvFence, InvLinearizable)
	for _, v := range r.Violations {
		if v.Invariant == InvFence && (len(v.Involved) != 2 || !strings.Contains(v.Message, "epoch 0 generation 1 was accepted after epoch 0 generation 2")) {
			t.Errorf("fence violation: %+v", v)
		}
	}
}

func TestDuplicateTokensFlagged(t *testing.T) {
	h := &hist{}
	h.acquire("A", 10, 20, "a1", OutOK, 1)
	h.acquire("B", 15, 25, "b1", OutOK, 1)
	r := h.check(t)
	wantViolated(t, r, InvUniqueTokens, InvLinearizable)
}

// An acquisition whose reply was lost must have happened for B's generation 2 to make sense,
// and a publication whose reply was lost must have happened for the read to make sense.
func TestUnknownThatMustHaveHappenedPasses(t *testing.T) {
	h := &hist{}
	h.acquire("A", 10, 0, "a1", "", 0) // killed: no return
	h.acquire("B", 500, 510, "b1", OutOK, 2)
	h.op("B", 520, 530, Record{Op: OpPublish, Owner: "b1", Gen: 2, Payload: "p-b1"}, Record{Out: OutUnknown, Err: "reply dropped"})
	h.get("R", 600, 610, 2, "p-b1")
	h.show("R", 620, 630, 2, "b1", 2, 4)
	r := h.check(t)
	if !r.OK() {
		t.Fatal("a history explained by its unknown operations was flagged")
	}
	if r.Unknown != 2 {
		t.Errorf("unknown = %d, want 2", r.Unknown)
	}
}

func TestPublishedGenerationBackwardsFlagged(t *testing.T) {
	h := valid()
	h.show("R", 400, 410, 3, "", 1, 4) // generation 3 had published; the row says 1 again
	r := h.check(t)
	wantViolated(t, r, InvPublishedGrows, InvReadsMonotonic, InvLinearizable)
}

func TestRenewAfterSupersededFlagged(t *testing.T) {
	h := &hist{}
	h.acquire("A", 10, 20, "a1", OutOK, 1)
	h.acquire("B", 100, 110, "b1", OutOK, 2)
	h.write("A", 120, 130, OpRenew, "a1", 1, "", OutOK)
	r := h.check(t)
	wantViolated(t, r, InvFence, InvLinearizable)
}

func TestSecondPublicationFlagged(t *testing.T) {
	h := &hist{}
	h.acquire("A", 10, 20, "a1", OutOK, 1)
	h.write("A", 30, 40, OpPublish, "a1", 1, "one", OutOK)
	h.write("A", 50, 60, OpPublish, "a1", 1, "two", OutOK)
	r := h.check(t)
	wantViolated(t, r, InvOnePublication, InvPublishedGrows, InvLinearizable)
}

func TestForeignPayloadFlagged(t *testing.T) {
	h := &hist{}
	h.acquire("A", 10, 20, "a1", OutOK, 1)
	h.write("A", 30, 40, OpPublish, "a1", 1, "one", OutOK)
	h.get("R", 50, 60, 1, "something else")
	r := h.check(t)
	wantViolated(t, r, InvPayloadBelongs, InvLinearizable)
}

// The excerpt of a violation holds the operations involved and those concurrent with them,
// not the whole history.
func TestExcerptIsSmall(t *testing.T) {
	h := &hist{}
	for i := int64(0); i < 50; i++ { // unrelated history before
		h.show("R", 1+i*2, 2+i*2, 0, "", 0, 0)
	}
	h.acquire("A", 1000, 1010, "a1", OutOK, 1)
	h.acquire("B", 1100, 1110, "b1", OutOK, 2)
	h.show("R", 1105, 1108, 1, "a1", 0, 0) // concurrent with B's acquisition
	h.write("A", 1200, 1210, OpPublish, "a1", 1, "stale", OutOK)
	r := h.check(t)
	for _, v := range r.Violations {
		if v.Invariant == InvFence && len(v.Excerpt) != 3 {
			t.Errorf("fence excerpt %v, want B's acquisition, the concurrent read and the stale publication", v.Excerpt)
		}
	}
	wantViolated(t, r, InvFence)
}

// Events about a worker keep its name, so that the report draws them on its lane.
func TestRecorderKeepsEventProc(t *testing.T) {
	dir := t.TempDir()
	rec, err := NewRecorder(dir+"/nemesis.jsonl", "nemesis")
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Write(Record{Kind: KindEvent, Event: FaultPause, Proc: "w1.1", EndTime: Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Call(Record{Op: OpShow, Resource: "r"}); err != nil {
		t.Fatal(err)
	}
	_ = rec.Close()
	h, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Events) != 1 || h.Events[0].Proc != "w1.1" || len(h.Ops) != 1 || h.Ops[0].Proc != "nemesis" || !h.Ops[0].Unknown() {
		t.Fatalf("events %+v ops %+v", h.Events, h.Ops)
	}
}

// TestRevivalAfterRowLockFlagged: the nemesis held the row from 30 to 90 while the lease it read
// expired at 60; A's renewal and publication, called at 40 and 45, waited on the lock. Accepted,
// they act on an expired lease; refused, the history is valid. A renewal called before the lock
// was held, or a lock released before the expiry, says nothing.
func TestRevivalAfterRowLockFlagged(t *testing.T) {
	build := func(out string, until int64) *hist {
		h := &hist{}
		h.acquire("A", 10, 20, "a1", OutOK, 1)
		h.write("A", 25, 28, OpRenew, "a1", 1, "", OutOK) // before the lock
		h.recs = append(h.recs, Record{Kind: KindEvent, Proc: "nemesis", Event: FaultRowLock, Time: 30, EndTime: 90,
			Resource: "r", Owner: "a1", Gen: 1, Until: until})
		h.write("A", 40, 95, OpRenew, "a1", 1, "", out)
		h.write("B", 45, 96, OpPublish, "a1", 1, "p-a1", out)
		return h
	}
	r := build(OutOK, 60).check(t)
	wantViolated(t, r, InvNoRevival)
	if n := len(r.Violations); n != 2 {
		t.Errorf("%d violations, want the renewal and the publication", n)
	}
	for _, c := range []struct {
		out   string
		until int64
	}{{OutRefused, 60}, {OutOK, 100}} {
		r := build(c.out, c.until).check(t)
		for _, v := range r.Violations {
			if v.Invariant == InvNoRevival {
				t.Errorf("out %s, expiry %d: flagged %s", c.out, c.until, v.Message)
			}
		}
	}
}

// TestGateStaleWriteFlagged: the gate must refuse a write whose token is older than the
// largest one whose holder was ready (its fence returned) before the write was sent, not the
// latest one to get ready. A write sent before the newer holder was ready may be accepted.
// Mutant: comparing with the latest fence to return, not the largest, misses the second write.
func TestGateStaleWriteFlagged(t *testing.T) {
	h := &hist{}
	fence := func(proc string, call, ret int64, owner string, gen int64) {
		h.op(proc, call, ret, Record{Op: OpFence, Owner: owner, Epoch: 7, Gen: gen}, Record{Out: OutOK})
	}
	gateWrite := func(proc string, call, ret int64, owner string, gen int64) {
		h.op(proc, call, ret, Record{Op: OpGateWrite, Owner: owner, Epoch: 7, Gen: gen, Payload: "ü\x00"}, Record{Out: OutOK})
	}
	h.acquire("A", 10, 20, "a 1", OutOK, 1)
	fence("A", 21, 25, "a 1", 1)
	h.acquire("B", 100, 110, "b ü", OutOK, 2)
	h.acquire("C", 120, 130, "c 3", OutOK, 3)
	fence("C", 131, 150, "c 3", 3)
	fence("B", 111, 200, "b ü", 2)     // ready after C, with the smaller token
	gateWrite("A", 140, 145, "a 1", 1) // sent before anyone newer was ready: may be accepted
	gateWrite("B", 210, 220, "b ü", 2) // sent after C was ready: stale
	r := h.check(t)
	var got []string
	for _, v := range r.Violations {
		if v.Invariant == InvGate {
			got = append(got, v.Message)
		}
	}
	if len(got) != 1 || !strings.Contains(got[0], "token 7.2 after the holder of 7.3") {
		t.Fatalf("gate violations %q, want the write of generation 2 only", got)
	}
}

// An owner identity is made fresh for every acquisition; a worker that used one twice (say,
// one restored from a checkpoint) could pass as the holder of a lease it did not take. The
// second acquisition below is legal in every other respect: only invariant 12 may catch it,
// and the same acquisition with a fresh identity is the control.
func TestOwnerUsedTwiceIsFlagged(t *testing.T) {
	for _, tc := range []struct {
		owner string
		want  bool
	}{{"a3", false}, {"a1", true}} {
		h := valid()
		h.acquire("A", 400, 410, tc.owner, OutOK, 4)
		r := h.check(t)
		flagged := false
		for _, v := range r.Violations {
			if v.Invariant != InvIdentityPerAcq {
				t.Errorf("owner %s: %s: %s", tc.owner, v.Invariant, v.Message)
			}
			flagged = true
		}
		if flagged != tc.want || len(r.Inconclusive) != 0 {
			t.Errorf("owner %s: flagged %v, want %v (inconclusive %v)", tc.owner, flagged, tc.want, r.Inconclusive)
		}
	}
}

// The checks keyed by owner hold one key per owner in place and any further key of the same
// owner apart (ownerMap): an owner used by two acquisitions (invariant 12 broken) must still
// have each of its leases known to invariant 6, and only those.
func TestOwnerUsedTwiceKeepsBothLeases(t *testing.T) {
	for _, tc := range []struct {
		gen  int64
		want bool
	}{{4, false}, {1, false}, {5, true}} {
		h := valid()
		h.acquire("A", 400, 410, "a1", OutOK, 4)
		h.write("A", 420, 430, OpRenew, "a1", tc.gen, "", OutOK)
		r := h.check(t)
		flagged := false
		for _, v := range r.Violations {
			flagged = flagged || v.Invariant == InvLeaseExists
		}
		if flagged != tc.want {
			t.Errorf("renew of generation %d: lease-exists flagged %v, want %v", tc.gen, flagged, tc.want)
		}
	}
}

// Resources are numbered in Build in sorted order, not in the order they appear: a violation
// must be reported on its own resource whatever the order of the resources' first operations.
func TestViolationNamesItsResource(t *testing.T) {
	h := valid() // on "r"
	h.op("C", 400, 410, Record{Op: OpAcquire, Resource: "a", Owner: "c1", TTLMs: 500}, Record{Out: OutOK, Gen: 1})
	h.op("D", 420, 430, Record{Op: OpAcquire, Resource: "a", Owner: "d1", TTLMs: 500}, Record{Out: OutOK, Gen: 1})
	r := h.check(t)
	wantViolated(t, r, InvUniqueTokens)
	for _, v := range r.Violations {
		if v.Resource != "a" {
			t.Errorf("%s reported on %q, want \"a\"", v.Invariant, v.Resource)
		}
	}
}
