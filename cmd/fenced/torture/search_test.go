package torture

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// mutate breaks one acknowledged reply of a correct history, as a buggy store would answer:
// a generation off by one, a read of another published generation, a refusal turned into an
// acceptance or an acceptance into a refusal. It returns a description of the change.
func mutate(recs []Record, rng *rand.Rand) string {
	for {
		i := rng.IntN(len(recs))
		r := &recs[i]
		if r.Kind != KindReturn || r.Proc == "nemesis" {
			continue
		}
		switch rng.IntN(4) {
		case 0:
			if r.Out == OutOK && r.Gen > 0 {
				r.Gen += int64(1 - 2*rng.IntN(2))
				return fmt.Sprintf("record %d: generation %d", i, r.Gen)
			}
		case 1:
			if r.Out == OutOK && r.ReadPub > 0 {
				r.ReadPub--
				return fmt.Sprintf("record %d: read published %d", i, r.ReadPub)
			}
		case 2:
			if r.Out == OutRefused {
				r.Out = OutOK
				return fmt.Sprintf("record %d: refusal accepted", i)
			}
		case 3:
			if r.Out == OutOK && r.Epoch == 0 && r.ReadPub == 0 && r.Gen == 0 && r.LeaseUntilUs == 0 {
				r.Out = OutRefused // a publication or release that took effect, answered refused
				return fmt.Sprintf("record %d: acceptance refused", i)
			}
		}
	}
}

// TestSearchAgreesWithPorcupine runs the linear search and porcupine side by side on small
// histories, correct and broken by one reply each: the search must reach porcupine's verdict
// every time (a passing verdict where porcupine finds none would be a violation it hides).
func TestSearchAgreesWithPorcupine(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	illegals := 0
	for seed := range uint64(300) {
		recs := synthetic(300, 5, 2, 100, seed)
		what := "correct"
		if seed%3 != 0 {
			what = mutate(recs, rng)
		}
		h := Build(recs, 0)
		byRes := map[string][]*Op{}
		for _, op := range h.Ops {
			byRes[op.Resource] = append(byRes[op.Resource], op)
		}
		for res, ops := range byRes {
			pops := porcupineOps(h, ops)
			want := porcupine.CheckOperations(model(state{}), pops)
			got := search(pops, []state{{}}, time.Now().Add(time.Minute))
			if got.verdict == timedOut {
				t.Fatalf("seed %d %s: the search timed out", seed, res)
			}
			if want != (got.verdict == linearizable) {
				t.Fatalf("seed %d (%s) on %s: porcupine says linearizable %v, the search %v", seed, what, res, want, got.verdict == linearizable)
			}
			if !want {
				illegals++
			}
		}
	}
	if illegals < 50 {
		t.Fatalf("only %d illegal resource histories among the mutants: the comparison proves little", illegals)
	}
}

// TestSearchOrderReplays checks a passing verdict's witness: replaying its order through the
// model from the initial state must succeed, each operation taking effect after every
// operation that returned before its call.
func TestSearchOrderReplays(t *testing.T) {
	h := Build(synthetic(5_000, 8, 1, 200, 3), 0)
	pops := porcupineOps(h, h.Ops)
	r := search(pops, []state{{}}, time.Now().Add(time.Minute))
	if r.verdict != linearizable || len(r.order) != len(pops) {
		t.Fatalf("verdict %v, order of %d of %d operations", r.verdict, len(r.order), len(pops))
	}
	st := newStateSet([]state{{}})
	var latestCall int64
	for i, k := range r.order {
		op := pops[k]
		if op.Return < latestCall {
			t.Fatalf("position %d: operation returned at %d, before an earlier-ordered call at %d", i, op.Return, latestCall)
		}
		latestCall = max(latestCall, op.Call)
		var ok bool
		if st, ok = stepSet(st, op.Input.(input), op.Output.(output)); !ok {
			t.Fatalf("position %d: the model refuses %s", i, op.Metadata.(*Op).Kind)
		}
	}
}

// TestViolationFarIntoLongHistoryFound breaks one reply near the end of a long history, on a
// resource with tens of thousands of operations before it: the search must still find that no
// order exists (the memo must not carry a verdict from one part of the history to another),
// and Check must report it as a linearizability violation.
func TestViolationFarIntoLongHistoryFound(t *testing.T) {
	recs := synthetic(20_000, 8, 2, 0, 11)
	// A show near the end that reads the generation one below the row's: stale, by one.
	for i := len(recs) * 9 / 10; i < len(recs); i++ {
		if recs[i].Kind == KindReturn && recs[i].Gen > 1 && recs[i].ReadOwner == "" && recs[i].NowUs != 0 {
			recs[i].Gen--
			break
		}
		if i == len(recs)-1 {
			t.Fatal("no show to break")
		}
	}
	r := Check(Build(recs, 0), nil, time.Minute)
	found := false
	for _, v := range r.Violations {
		found = found || v.Invariant == InvLinearizable
	}
	if !found {
		t.Fatalf("the stale show was not found; violations %v", r.Violations)
	}
}
