package torture

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
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
			pops := porcupineOps(ops)
			want := porcupine.CheckOperations(model(state{}), pops)
			got := search(pops, []state{{}}, time.Now().Add(time.Minute), 0)
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
	pops := porcupineOps(h.Ops)
	r := search(pops, []state{{}}, time.Now().Add(time.Minute), 0)
	if r.verdict != linearizable || len(r.order) != len(pops) {
		t.Fatalf("verdict %v, order of %d of %d operations", r.verdict, len(r.order), len(pops))
	}
	states := []state{{}}
	var latestCall int64
	for i, k := range r.order {
		op := pops[k]
		if op.Return < latestCall {
			t.Fatalf("position %d: operation returned at %d, before an earlier-ordered call at %d", i, op.Return, latestCall)
		}
		latestCall = max(latestCall, op.Call)
		var next []state
		for _, st := range states {
			for _, n := range step(st, op.Input.(input), op.Output.(output)) {
				if !slices.Contains(next, n.(state)) {
					next = append(next, n.(state))
				}
			}
		}
		if states = next; len(states) == 0 {
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
	breakShow(t, recs)
	r := Check(Build(recs, 0), nil, time.Minute)
	found := false
	for _, v := range r.Violations {
		found = found || v.Invariant == InvLinearizable
	}
	if !found {
		t.Fatalf("the stale show was not found; violations %v", r.Violations)
	}
}

// breakShow makes a show near the end of recs read the generation one below the row's: stale,
// by one, which only the model sees.
func breakShow(t *testing.T, recs []Record) {
	t.Helper()
	for i := len(recs) * 9 / 10; i < len(recs); i++ {
		if recs[i].Kind == KindReturn && recs[i].Gen > 1 && recs[i].ReadOwner == "" && recs[i].NowUs != 0 {
			recs[i].Gen--
			return
		}
	}
	t.Fatal("no show to break")
}

// burst is a resource on which k acquisitions are left without a reply (each may or may not
// have taken effect, in any order), as a Redis restart or a stalled connection leaves them,
// followed by the reads: shows at call times 10 000, 20 000, ... returning (generation, owner
// index, -1 for none). The epoch is bumped (7) before them; owners have spaces and non-ASCII.
func burst(k int, shows ...[2]int) []porcupine.Operation {
	const end = 1 << 40
	owner := func(i int) string { return fmt.Sprintf("owner ü %d", i) }
	ops := []porcupine.Operation{{ClientId: 0, Call: 1, Return: 2,
		Input: input{Kind: OpBump}, Output: output{Out: OutOK, Epoch: 7}}}
	for i := range k {
		ops = append(ops, porcupine.Operation{ClientId: 1 + i, Call: int64(10 + i), Return: end,
			Input: input{Kind: OpAcquire, Owner: owner(i)}, Output: output{Out: OutUnknown}})
	}
	for j, s := range shows {
		o := ""
		if s[1] >= 0 {
			o = owner(s[1])
		}
		at := int64(10_000 * (j + 1))
		ops = append(ops, porcupine.Operation{ClientId: 0, Call: at, Return: at + 1,
			Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: int64(s[0]), Owner: o}})
	}
	return ops
}

// TestUnknownBurstStaysSmall: 300 acquisitions without a reply, then reads, decided within
// 10 s whether an order exists or not. The owners no read names are kept as one, so the memo
// holds one entry per generation and owner named for a count of acquisitions taken, not one
// per generation and owner; the reads that name an owner are still held to it. Mutant: merging owners whatever is still to be ordered (a read naming one
// included) fails the cases where a read names an owner; ordering twins freely (no prevTwin
// check in search.go) times out on every case; taking acquisitions whose owners a read
// names for twins (ordered by their calls) fails the one where the later call took effect
// first.
func TestUnknownBurstStaysSmall(t *testing.T) {
	cases := []struct {
		name  string
		shows [][2]int
		want  verdict
	}{
		{"the 3rd acquisition, read, then read as none", [][2]int{{3, 150}, {3, -1}, {3, 150}}, linearizable},
		{"at most 300 acquisitions took effect", [][2]int{{301, -1}}, illegal},
		{"an owner read at a generation, then another at the same", [][2]int{{3, 5}, {3, 6}}, illegal},
		{"an owner after none at the same generation", [][2]int{{3, -1}, {3, 150}}, linearizable},
		{"an acquisition called later took effect first", [][2]int{{1, 5}, {2, 3}}, linearizable},
		{"a generation read after a later one", [][2]int{{5, -1}, {4, -1}}, illegal},
		{"an owner read after its generation went by", [][2]int{{3, 5}, {4, -1}, {3, 5}}, illegal},
	}
	for _, c := range cases {
		// Proving that no order exists explored every subset of the acquisitions ordered
		// before each read until twins were ordered by their calls, and every placement of
		// the named ones among the twins until the search followed single states (search.go):
		// the illegal cases had 10, then 30 acquisitions. They have 300, like the others.
		ops := burst(300, c.shows...)
		r := search(ops, []state{{}}, time.Now().Add(10*time.Second), 0)
		if r.verdict != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, r.verdict, c.want)
		}
	}
}

// twinsAndNamed is the history TestTwinsWithNamedUnknownsDecide checks: k acquisitions left
// without a reply whose owners no read names (twins), among them three whose owners a read
// names (named unknowns: acquisitions 50, 120 and 250, read at generations 3, 6 and 9), then a
// read of none at generation 12. Broken, the third read names its owner at generation 5 instead,
// after generation 6 was read: a generation going back, which no order explains.
func twinsAndNamed(k int, broken bool) []porcupine.Operation {
	third := [2]int{9, 250}
	if broken {
		third = [2]int{5, 250}
	}
	return burst(k, [2]int{3, 50}, [2]int{6, 120}, third, [2]int{12, -1})
}

// TestTwinsWithNamedUnknownsDecide: 300 acquisitions without a reply, three of them named by
// later reads, decided both ways. A search over sets of states timed out on the broken one: the
// set after each acquisition a read names depends on how many twins were ordered before it
// (its owner may hold any generation up to there), so every placement of the three among the
// twins made a different set, O(k⁴) of them. Searching single states, a memo entry is (state,
// twins ordered, other operations ordered): O(k²) of them.
// Mutant: ordering twins freely (no prevTwin check) times out on the broken one.
func TestTwinsWithNamedUnknownsDecide(t *testing.T) {
	for _, c := range []struct {
		broken bool
		want   verdict
	}{{false, linearizable}, {true, illegal}} {
		ops := twinsAndNamed(300, c.broken)
		start := time.Now()
		r := search(ops, []state{{}}, start.Add(30*time.Second), 0)
		t.Logf("broken %v: verdict %d in %s", c.broken, r.verdict, time.Since(start))
		if r.verdict != c.want {
			t.Errorf("broken %v: verdict %d, want %d", c.broken, r.verdict, c.want)
		}
		if c.want == illegal && r.culprit != len(ops)-2 {
			t.Errorf("culprit %d, want the broken read %d", r.culprit, len(ops)-2)
		}
	}
}

// TestDroppedReplyIsNotDeferred: an acquisition whose reply was dropped (it may have taken
// effect between its call and the drop, not later), then reads of generation 0 and 1 after
// the drop. No order explains both: had it taken effect, it did before the first read. Only
// operations open until the end of the history may be ordered as not taking effect and left
// for last. Mutant: deferring every unknown outcome (whatever its return) passes it.
func TestDroppedReplyIsNotDeferred(t *testing.T) {
	show := func(at int64, gen int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Call: at, Return: at + 1,
			Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: gen}}
	}
	ops := []porcupine.Operation{
		{ClientId: 0, Call: 1, Return: 2, Input: input{Kind: OpAcquire, Owner: "owner ü 1"}, Output: output{Out: OutUnknown}},
		show(10, 0), show(20, 1),
	}
	for i := range ops {
		ops[i].Metadata = &Op{Resource: "res ü 1"}
	}
	if porcupine.CheckOperations(model(state{}), ops) {
		t.Fatal("porcupine finds an order: the history does not test the search")
	}
	if r := search(ops, []state{{}}, time.Now().Add(time.Minute), 0); r.verdict != illegal {
		t.Fatalf("verdict %d, want illegal", r.verdict)
	}
}

// BenchmarkSearchTwinsAndNamed: the search on TestTwinsWithNamedUnknownsDecide's history,
// legal (the baseline) and broken; the ratio of their times says what proving no order exists
// costs beside finding one.
func BenchmarkSearchTwinsAndNamed(b *testing.B) {
	for _, c := range []struct {
		name   string
		broken bool
		want   verdict
	}{{"legal", false, linearizable}, {"illegal", true, illegal}} {
		ops := twinsAndNamed(300, c.broken)
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if r := search(ops, []state{{}}, time.Now().Add(time.Minute), 0); r.verdict != c.want {
					b.Fatalf("verdict %d, want %d", r.verdict, c.want)
				}
			}
		})
	}
}

// TestUnknownPublicationWaitsForARestore: a publication left without a reply by an owner that
// lost the lease may still take effect after a restore gives that owner the lease back. The
// second pass passes over it while another owner holds the lease (here, when a read needs an
// unanswered acquisition to have taken effect), and takes it out of its list only once nothing
// left to order can give its owner the lease again. Legal: the last read needs the publication
// after the restore. Mutant: taking it out whenever another owner holds the lease makes it
// illegal.
func TestUnknownPublicationWaitsForARestore(t *testing.T) {
	const end = 100 // the history's end: the unknown outcomes stay open until then
	owner, other, lost := "owner ü\x00 1", "owner ü 2", "owner ü 3"
	payload := "payload \x00 ü"
	ops := []porcupine.Operation{
		{Call: 1, Return: 2, Input: input{Kind: OpAcquire, Owner: owner}, Output: output{Out: OutOK, Epoch: 7, Gen: 41}},
		{Call: 2, Return: end, Input: input{Kind: OpAcquire, Owner: lost}, Output: output{Out: OutUnknown}},
		{Call: 3, Return: end, Input: input{Kind: OpPublish, Owner: owner, Gen: 41, Payload: payload}, Output: output{Out: OutUnknown}},
		{Call: 4, Return: 5, Input: input{Kind: OpAcquire, Owner: other}, Output: output{Out: OutOK, Epoch: 7, Gen: 42}},
		{Call: 7, Return: 8, Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: 43}},
		{Call: 9, Return: 10, Input: input{Kind: OpRestore, Owner: owner, Gen: 41, Epoch: 7}, Output: output{Out: OutOK}},
		{Call: 11, Return: 12, Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: 41, Owner: owner, Pub: 41, PayloadBytes: int64(len(payload))}},
	}
	for i := range ops {
		ops[i].ClientId = i
		ops[i].Metadata = &Op{Resource: "res ü 1"}
	}
	init := state{Epoch: 7, Gen: 40}
	if !porcupine.CheckOperations(model(init), ops) {
		t.Fatal("porcupine finds no order: the history does not test the search")
	}
	if r := search(ops, []state{init}, time.Now().Add(time.Minute), 0); r.verdict != linearizable {
		t.Fatalf("verdict %d, want linearizable (culprit %d)", r.verdict, r.culprit)
	}
}

// TestMemoHoldsExhaustedPairsOnly checks the memo's bookkeeping (search.go, seen): a pair
// enters when the search backtracks out of it, so a history ordered without backtracking
// leaves only the initial pair, and the pruning is the same as when every pair entered on
// the way down: the step counts below are those that search took on these histories with
// that memo (main at 97481aa), on a passing history with many unknown outcomes and on an
// illegal one, less the steps it spent walking over the deferrable calls made after a stuck
// return, which the search no longer walks over (skipAfter; 12 605 and 6 861 of them, counted
// on the search before that change, whose backtracks, descents and memo were the same). They
// are counted without the generation bound, which cuts both short (and the memo with them):
// with it, the passing history takes 4 070 steps, and the illegal one 379 before the search
// without it that reports its culprit (searchModel).
func TestMemoHoldsExhaustedPairsOnly(t *testing.T) {
	run := func(recs []Record, bounded bool) searchResult {
		h := Build(recs, 0)
		return searchOrders(fromPorcupine(porcupineOps(h.Ops)), []state{{}}, time.Now().Add(time.Minute), 0, bounded)
	}
	if r := run(synthetic(5_000, 8, 1, 0, 3), false); r.verdict != linearizable || r.steps != 5_001 || r.memo > 1 {
		t.Errorf("no unknown outcome: verdict %v, %d steps, %d pairs in the memo; want linearizable, 5001, at most 1", r.verdict, r.steps, r.memo)
	}
	if r := run(synthetic(5_000, 8, 1, 5, 3), false); r.verdict != linearizable || r.steps != 7_330 || r.memo == 0 {
		t.Errorf("one unknown outcome in 5: verdict %v, %d steps, %d pairs in the memo; want linearizable, 7330, some", r.verdict, r.steps, r.memo)
	}
	if r := run(synthetic(5_000, 8, 1, 5, 3), true); r.verdict != linearizable || r.steps != 4_070 {
		t.Errorf("one unknown outcome in 5, bounded: verdict %v, %d steps; want linearizable, 4070", r.verdict, r.steps)
	}
	recs := synthetic(2_000, 8, 1, 5, 3)
	what := mutate(recs, rand.New(rand.NewPCG(13, 13)))
	if r := run(recs, false); r.verdict != illegal || r.steps != 2_624 {
		t.Errorf("mutant (%s): verdict %v after %d steps; want illegal after 2624", what, r.verdict, r.steps)
	}
	if r := run(recs, true); r.verdict != illegal || r.steps != 379 || r.pruned == 0 {
		t.Errorf("mutant (%s), bounded: verdict %v after %d steps, %d pruned; want illegal after 379, some pruned", what, r.verdict, r.steps, r.pruned)
	}
	// 1 000 steps decide it with the bound, not without: the bounded run's verdict stands,
	// and both runs together take no more than the budget.
	h := Build(recs, 0)
	if r := searchModel(fromPorcupine(porcupineOps(h.Ops)), []state{{}}, time.Now().Add(time.Minute), 1_000); r.verdict != illegal || r.steps != 1_000 {
		t.Errorf("mutant (%s), 1000 steps: verdict %v after %d steps; want illegal after 1000", what, r.verdict, r.steps)
	}
}

// TestBacktrackRestoresTheOwnersNumber: the search first orders A's release before a get and
// a show that both happened while A still held the lease; the show, naming A, then fails, and
// the search backtracks to the state A holds. That state's owner number must come back with
// it: a number left from the released state (none) makes A unobservable at the get, and the
// show naming A then fails in every order (a false alarm).
func TestBacktrackRestoresTheOwnersNumber(t *testing.T) {
	const owner = "owner ü\x00 1"
	ops := []porcupine.Operation{
		{ClientId: 0, Call: 0, Return: 10, Input: input{Kind: OpAcquire, Owner: owner}, Output: output{Out: OutOK, Epoch: 2, Gen: 1}},
		{ClientId: 0, Call: 20, Return: 100, Input: input{Kind: OpRelease, Owner: owner, Gen: 1}, Output: output{Out: OutOK}},
		{ClientId: 1, Call: 30, Return: 40, Input: input{Kind: OpGet}, Output: output{Out: OutNotFound}},
		{ClientId: 2, Call: 35, Return: 50, Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: 1, Owner: owner}},
	}
	for i := range ops {
		ops[i].Metadata = &Op{Resource: "res ü 1"}
	}
	init := state{Epoch: 2}
	if !porcupine.CheckOperations(model(init), ops) {
		t.Fatal("porcupine finds no order: the history does not test the search")
	}
	if r := search(ops, []state{init}, time.Now().Add(time.Minute), 0); r.verdict != linearizable {
		t.Fatalf("verdict %d, want linearizable", r.verdict)
	}
}

// TestStampOrderMatchesStableSort holds stampOrder to the order the search took from a stable
// comparison sort until issue 13, on random operations: times from a few values (many ties,
// calls and returns at the same instant), calls in order or not, unknown outcomes returning
// together at the end, and times at int64's extremes (a range wider than int64 holds).
func TestStampOrderMatchesStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 13))
	for round := range 3000 {
		n := rng.IntN(300)
		spread := []int64{3, 50, 1 << 20, 1 << 40}[rng.IntN(4)]
		base := []int64{0, -1 << 30, math.MinInt64 / 2}[rng.IntN(3)]
		end := base + spread*int64(n+2)
		ops := make([]modelOp, n)
		for i := range ops {
			call := base + int64(i)*spread/4 + rng.Int64N(spread)
			if round%3 == 0 {
				call = base + rng.Int64N(spread*int64(n+1)) // calls in no order
			}
			ops[i] = modelOp{call: call, ret: call + rng.Int64N(spread)}
			if rng.IntN(10) == 0 {
				ops[i].ret = end // unknown outcome
			}
		}
		if round%50 == 1 && n > 1 {
			ops[0].call, ops[n-1].ret = math.MinInt64, math.MaxInt64
		}
		want := make([]stamp, 0, 2*n)
		for i, op := range ops {
			want = append(want, stamp{i, false, op.call}, stamp{i, true, op.ret})
		}
		slices.SortStableFunc(want, func(a, b stamp) int {
			switch {
			case a.t != b.t:
				return cmp.Compare(a.t, b.t)
			case a.ret == b.ret:
				return 0
			case b.ret:
				return -1
			}
			return 1
		})
		wantCall := make([]int, n)
		for i := range wantCall {
			wantCall[i] = i
		}
		sort.SliceStable(wantCall, func(a, b int) bool { return ops[wantCall[a]].call < ops[wantCall[b]].call })
		got, byCall := stampOrder(ops)
		if !slices.Equal(got, want) || !slices.Equal(byCall, wantCall) {
			t.Fatalf("round %d, %d operations: stamps %v\nwant %v\ncalls %v, want %v", round, n, got, want, byCall, wantCall)
		}
	}
}

// TestEraOfMatchesSearch holds eraOf, which walks forward from the era of the previous call,
// to the binary search it replaced, on random eras and calls, mostly in order, some not, some
// before the first era or after the last.
func TestEraOfMatchesSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 14))
	for round := range 500 {
		eras := make([]clockEra, rng.IntN(12))
		to := rng.Int64N(100)
		for i := range eras {
			to += 1 + rng.Int64N(100)
			eras[i].to = to
		}
		at, call := 0, int64(-50)
		for range 200 {
			call += rng.Int64N(60)
			if rng.IntN(20) == 0 {
				call -= rng.Int64N(400) // out of order
			}
			want := sort.Search(len(eras), func(i int) bool { return eras[i].to > call })
			if at = eraOf(eras, at, call); at != want {
				t.Fatalf("round %d: call %d in eras %v: era %d, want %d", round, call, eras, at, want)
			}
		}
	}
}

// TestGenerationBoundChangesNoVerdict runs the search with and without the generation bound
// (searchOrders) on small histories, correct and broken by one reply, with many unknown
// outcomes, and on the bursts of unanswered acquisitions: the verdicts must be the same, and
// what searchModel reports for an illegal one (culprit, depth) the unbounded search's. The
// bound must also have ruled something out, on passing and on illegal histories.
func TestGenerationBoundChangesNoVerdict(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 21))
	var histories [][]modelOp
	for seed := range uint64(400) {
		// Half of them with a restore that takes the generations back (seeds 200 and up),
		// where the bound counts only the operations that return before it.
		recs := simulate(400, 5, 2, 8, seed, seed >= 200)
		if seed%2 == 1 {
			mutate(recs, rng)
		}
		h := Build(recs, 0)
		byRes := map[string][]*Op{}
		for _, op := range h.Ops {
			byRes[op.Resource] = append(byRes[op.Resource], op)
		}
		for _, ops := range byRes {
			histories = append(histories, fromPorcupine(porcupineOps(ops)))
		}
	}
	for _, broken := range []bool{false, true} {
		histories = append(histories, fromPorcupine(twinsAndNamed(60, broken)))
	}
	// A restore takes the generation back: an unanswered acquisition must take effect for a
	// read of generation 1, although an acquisition after the restore is granted 1 again.
	histories = append(histories, fromPorcupine([]porcupine.Operation{
		{Call: 1, Return: 1000, Input: input{Kind: OpAcquire, Owner: "a"}, Output: output{Out: OutUnknown}},
		{Call: 10, Return: 11, Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: 1}},
		{Call: 20, Return: 21, Input: input{Kind: OpRestore}, Output: output{Out: OutOK}},
		{Call: 30, Return: 31, Input: input{Kind: OpAcquire, Owner: "b"}, Output: output{Out: OutOK, Gen: 1}},
	}))
	// A read that returns just as a restore is called may come after it: at the same instant,
	// a call comes before a return. The read of generation 2 needs the unanswered acquisition,
	// and the read of generation 1 after it the restore, which the bound must not rule out.
	histories = append(histories, fromPorcupine([]porcupine.Operation{
		{Call: 1, Return: 2, Input: input{Kind: OpAcquire, Owner: "a"}, Output: output{Out: OutOK, Gen: 1}},
		{Call: 3, Return: 1000, Input: input{Kind: OpAcquire, Owner: "b"}, Output: output{Out: OutUnknown}},
		{Call: 4, Return: 5, Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: 2}},
		{Call: 6, Return: 20, Input: input{Kind: OpShow}, Output: output{Out: OutOK, Gen: 1}},
		{Call: 20, Return: 21, Input: input{Kind: OpRestore, Gen: 1}, Output: output{Out: OutOK}},
	}))
	prunedPassing, prunedIllegal, prunedRestored := 0, 0, 0
	for i, ops := range histories {
		deadline := time.Now().Add(time.Minute)
		with := searchOrders(ops, []state{{}}, deadline, 0, true)
		without := searchOrders(ops, []state{{}}, deadline, 0, false)
		if with.verdict != without.verdict || with.verdict == timedOut {
			t.Fatalf("history %d: verdict %d with the bound, %d without", i, with.verdict, without.verdict)
		}
		if slices.ContainsFunc(ops, func(op modelOp) bool { return op.in.Kind == OpRestore }) {
			prunedRestored += with.pruned
		}
		if with.verdict == illegal {
			prunedIllegal += with.pruned
			if r := searchModel(ops, []state{{}}, deadline, 0); r.culprit != without.culprit || r.depth != without.depth {
				t.Fatalf("history %d: culprit %d at depth %d, want %d at %d", i, r.culprit, r.depth, without.culprit, without.depth)
			}
		} else {
			prunedPassing += with.pruned
		}
	}
	if prunedPassing == 0 || prunedIllegal == 0 || prunedRestored == 0 {
		t.Errorf("the bound ruled out %d operations on passing histories, %d on illegal ones, %d with a restore: the test shows nothing",
			prunedPassing, prunedIllegal, prunedRestored)
	}
}
