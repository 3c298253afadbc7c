package torture

import (
	"hash/maphash"
	"math"
	"math/rand/v2"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability search below is the same search as porcupine's (Wing and Gong's, with
// Lowe's memo of (linearized set, state) pairs already explored), with one change that makes
// it linear in the length of a passing history instead of quadratic: porcupine keys its memo
// with a bitset of the whole history, cloned, hashed and compared at every step (O(n/64) per
// step, O(n²/64) time and memory per resource), where this search keys it with two 64-bit
// Zobrist hashes of the linearized set, updated in O(1) per step, combined with two hashes of
// the state.
//
// The model is nondeterministic (an outcome left unknown may or may not have taken effect).
// Porcupine, and this search until issue 13, followed the set of states the resource may be in
// (a powerset construction); this search follows one state and backtracks over the outcomes
// as over the orders. The sets were the slow part of proving a history illegal: after a burst
// of unanswered acquisitions, the set depends on where among them each acquisition that a
// later read names was ordered (its owner may hold any generation reached by then), so every
// placement made a new memo entry, O(k^(m+1)) of them for k acquisitions and m named ones,
// and 300 of them with three named ran past the timeout. With one state, an entry is (state,
// acquisitions ordered taking effect, other operations ordered), and the same history is
// decided in a fraction of a second either way (TestTwinsWithNamedUnknownsDecide).
//
// Why a hashed memo cannot hide a violation: the memo only prunes. A passing verdict is a
// complete linearization that was found, step by step, with the model; it holds whatever the
// memo did. A false memo hit (two different (set, state) pairs with the same 128 bits) could
// only prune a branch that would have succeeded, i.e. make a linearizable history look
// illegal; Check never reports that verdict on this search's word alone when porcupine can
// decide: it then runs porcupine, whose memo is exact, for the verdict and the culprit.

// unobservable is the owner of a state whose real owner no operation left to order names: an
// owner appears in the model only through the operations that name it (its acquisition, its
// lease's renewals, publications and releases, a read or a copy that returned it, a restore
// that sets it), and every other step treats two owners that none of them names alike (an
// acquisition's owner differs from both, a release, publication or renewal by another owner
// is not current in either, a read returns neither, or "" for both). So once the last
// operation naming an owner is ordered, the states that differ only in such owners have the
// same futures, and are kept as one. This is exact, not an approximation: it changes no
// verdict. It matters where outcomes are unknown in bursts: k acquisitions without a reply,
// each taking effect or not, leave the resource at any of k generations with any of k owners
// (k² states), where nothing after them names those owners (their workers never used the
// leases) and the owner-blind k states are enough. Operations never name it: owner
// identities are made by the workers and are never empty, never start with a NUL.
const unobservable = "\x00unobservable"

// verdict is the outcome of one resource's search.
type verdict int

const (
	linearizable verdict = iota
	illegal
	timedOut  // the deadline passed
	undecided // the step budget ran out
)

// searchResult is a search's verdict, and when illegal, the operation whose return the search
// could not get past at its deepest (the first, in time, that no order explains), by index in
// the operations searched.
type searchResult struct {
	verdict verdict
	culprit int
	depth   int // longest partial linearization, in operations
	steps   int // steps taken: operations tried, returns reached, events passed over
	memo    int // (set, state) pairs in the memo at the verdict
	pruned  int // deferrable operations the generation bound ruled out (searchOrders)
	order   []int
}

// seed1 and seed2 hash states for the memo.
var (
	seed1 = maphash.MakeSeed()
	seed2 = maphash.MakeSeed()
)

// event is one call or return in the doubly linked list the search lifts operations out of.
type event struct {
	op         int
	ret        bool
	match      int // a call's return event
	prev, next int // -1: none; event 0 is the head sentinel
}

// search decides whether ops (one resource's, as porcupineOps makes them) can be ordered so
// that each takes effect between its call and its return and the model allows the sequence,
// starting in one of init's states. It gives up at deadline, or after maxSteps steps (none
// when 0): proving that no order exists may take time exponential in the number of operations
// open at once, and a budget in steps bounds it whatever the machine's load.
func search(ops []porcupine.Operation, init []state, deadline time.Time, maxSteps int) searchResult {
	return searchModel(fromPorcupine(ops), init, deadline, maxSteps)
}

// fromPorcupine is ops as the model reads them, their owners numbered.
func fromPorcupine(ops []porcupine.Operation) []modelOp {
	mops := make([]modelOp, len(ops))
	for i, op := range ops {
		mops[i] = modelOp{in: op.Input.(input), out: op.Output.(output), call: op.Call, ret: op.Return}
	}
	numberOwners(mops)
	return mops
}

// numberOwners sets the owner numbers of ops (modelOp.inOwner, outOwner) with a map of the
// owners' strings: the checker numbers them without hashing a string (modelOps).
func numberOwners(ops []modelOp) {
	ids := map[string]int32{}
	number := func(o string) int32 {
		if o == "" {
			return -1
		}
		id, ok := ids[o]
		if !ok {
			id = int32(len(ids))
			ids[o] = id
		}
		return id
	}
	for i := range ops {
		ops[i].inOwner, ops[i].outOwner = number(ops[i].in.Owner), number(ops[i].out.Owner)
	}
}

// searchModel is search on the operations as the model reads them, held by value in one
// slice, their owners numbered: the checker calls it directly, and makes porcupine's
// operations (an input and an output boxed on the heap for each) only when porcupine has to
// run.
//
// The search first runs with the generation bound (searchOrders, need), which only cuts off
// branches that cannot succeed, but thereby can change the return the search could not get
// past at its deepest: the culprit reported for an illegal history (a read that goes back a
// generation becomes the read before it, whose generation the search no longer reaches;
// TestTwinsWithNamedUnknownsDecide). So when the bound ruled anything out on the way to an
// illegal verdict, the search runs again without it, and that run's verdict, culprit and
// depth are reported: the search's before the bound, unless the steps (both runs share
// maxSteps) or the time run out first, when the bounded run's are. An illegal history costs
// what it did before plus the bounded run; a passing one no longer pays for the branches the
// bound cuts. TestGenerationBoundChangesNoVerdict checks that the bound changes no verdict.
func searchModel(ops []modelOp, init []state, deadline time.Time, maxSteps int) searchResult {
	r := searchOrders(ops, init, deadline, maxSteps, true)
	if r.verdict != illegal || r.pruned == 0 || (maxSteps > 0 && r.steps >= maxSteps) {
		return r
	}
	budget := 0
	if maxSteps > 0 {
		budget = maxSteps - r.steps
	}
	again := searchOrders(ops, init, deadline, budget, false)
	again.steps += r.steps
	if again.verdict == undecided || again.verdict == timedOut {
		// Out of steps or time: the bounded run's verdict stands, with its culprit.
		r.steps = again.steps
		return r
	}
	return again
}

// searchOrders is searchModel's search, with the generation bound (see need) when bounded.
func searchOrders(ops []modelOp, init []state, deadline time.Time, maxSteps int, bounded bool) searchResult {
	n := len(ops)
	stamps, byCall := stampOrder(ops)
	// Deferrable operations: outcome unknown and open until the end of the history (every
	// call comes before their return, and every other return but a deferrable one's). Not
	// taking effect changes nothing, and such an operation can then be ordered last, after
	// every other, so the search only orders them taking effect, passes over their returns,
	// and is done once every other operation is ordered. An unknown outcome with a return
	// before that (a dropped reply) is not deferrable: had it taken effect, it did before its
	// return (TestDroppedReplyIsNotDeferred). Without this, a burst of them multiplied the
	// memo's entries by the count ordered not taking effect: (state, count ordered) is O(k²),
	// (state, count taken) O(k), the generation moving with the count.
	var maxCall, maxRet int64
	for _, op := range ops {
		maxCall = max(maxCall, op.call)
		if op.out.Out != OutUnknown {
			maxRet = max(maxRet, op.ret)
		}
	}
	deferrable := make([]bool, n)
	required := 0
	for i, op := range ops {
		deferrable[i] = op.out.Out == OutUnknown && op.ret >= maxRet && op.ret >= maxCall
		if !deferrable[i] {
			required++
		}
	}
	// Zobrist keys: each operation's pair of random words, XORed in while it is linearized.
	rng := rand.New(rand.NewPCG(uint64(n), 0x5eed))
	z1, z2 := make([]uint64, n), make([]uint64, n)
	for i := range n {
		z1[i], z2[i] = rng.Uint64(), rng.Uint64()
	}
	// Owners no operation left to order can tell apart (see unobservable) are replaced by one
	// placeholder. mentions[i] are the owners operation i names (in its input, or in what a read
	// returned; -1 for none, held in place: no allocation per operation); left counts, per
	// owner, the operations naming it not yet ordered. Owners are known by their numbers
	// (modelOp.inOwner, outOwner), and a state's owner by the number kept beside it (stID):
	// no owner's string is hashed here (at a million operations, a cache miss each).
	mentions := make([][2]int32, n)
	inOwner := make([]int32, n)
	owners := int32(0)
	for _, op := range ops {
		owners = max(owners, op.inOwner+1, op.outOwner+1)
	}
	left := make([]int32, owners)
	for i, op := range ops {
		inOwner[i], mentions[i] = op.inOwner, [2]int32{-1, -1}
		for _, id := range [2]int32{op.inOwner, op.outOwner} {
			if id < 0 {
				continue
			}
			switch m := &mentions[i]; {
			case m[0] < 0:
				m[0] = id
				left[id]++
			case m[0] != id:
				m[1] = id
				left[id]++
			}
		}
	}
	// idOf is the number of an initial state's owner, -1 when no operation names it.
	idOf := func(owner string) int32 {
		for _, op := range ops {
			if op.in.Owner == owner {
				return op.inOwner
			}
			if op.out.Owner == owner {
				return op.outOwner
			}
		}
		return -1
	}
	// Twins. Operations with the same input and output but for an owner that only they name,
	// and the same return, have the same effect on the states (their owners become
	// unobservable as soon as they are ordered) and the same deadline. In any order the model
	// allows, giving their places to them in the order of their calls is again such an order
	// (the i-th earliest call is no later than the i-th place: i of them were called by then),
	// so the search orders each only after its twins called before it (prevTwin). This keeps
	// at least one order of every kind that could succeed: it changes no verdict. Without it,
	// k acquisitions left without a reply (Redis: a restart, a stalled connection; all open
	// until the end of the history) are ordered in any of their 2^k subsets before each point
	// the search backtracks to, and the memo, keyed by the set ordered, tells the subsets
	// apart: one Redis resource (992 operations, 30 such acquisitions, a restart's own bump to
	// be placed after a publication they overlap) never finished; with it, k+1 sets. With
	// deferral, the twins taking effect are thus the earliest called: a count.
	prevTwin := make([]int, n)
	{
		initOwner := map[string]bool{}
		for _, s := range init {
			initOwner[s.Owner] = true
		}
		type twinKey struct {
			in  input
			out output
			ret int64
		}
		// Only operations that return at the same instant as another can be twins: in a
		// passing history, mostly those open to the end. The others stay out of the map.
		sharedRet := make([]bool, n)
		for k := 1; k < len(stamps); k++ {
			if a, b := stamps[k-1], stamps[k]; a.ret && b.ret && a.t == b.t {
				sharedRet[a.op], sharedRet[b.op] = true, true
			}
		}
		last := map[twinKey]int{}
		for _, i := range byCall {
			prevTwin[i] = -1
			if !sharedRet[i] {
				continue
			}
			in, out := ops[i].in, ops[i].out
			if out.Owner != "" || (inOwner[i] >= 0 && (left[inOwner[i]] != 1 || initOwner[in.Owner])) {
				continue // it names an owner something else names: no twin
			}
			in.Owner = ""
			k := twinKey{in, out, ops[i].ret}
			if j, ok := last[k]; ok {
				prevTwin[i] = j
			}
			last[k] = i
		}
	}
	// Two lists run through ev: the main one (head ev[0]) holds, in time order, the calls and
	// returns of the operations that must be ordered; the other (head ev[dHead]), newest
	// first, the calls of the deferrable ones that may go next (a twin joins it when the twin
	// before it is ordered, in that one's place), whose returns, at the end of the history,
	// are in neither. The first pass walks the main list up to its first return, the second
	// the other one. A step thus looks at the operations open at that point and the
	// deferrable candidates, not at every deferrable operation left: they stay open to the end
	// and, walked over at every step, made the check of a resource quadratic in its length
	// (with one outcome in 200 unknown, 125 000 operations left hundreds to walk over per step).
	// Newest first: the effect a stuck return needs is most often the latest unknown one; in
	// call order, an old unknown outcome was tried first, and through it every twin after it.
	dHead := 2*n + 1
	ev := make([]event, 2*n+2)
	ev[0] = event{op: -1, prev: -1, next: -1}
	ev[dHead] = event{op: -1, prev: -1, next: -1}
	nextTwin := make([]int, n)
	for i := range nextTwin {
		nextTwin[i] = -1
	}
	for i, t := range prevTwin {
		if t >= 0 && deferrable[i] {
			nextTwin[t] = i
		}
	}
	tail := 0
	callOf := make([]int, n)
	for k, s := range stamps {
		e := k + 1
		ev[e] = event{op: s.op, ret: s.ret, prev: -1, next: -1}
		if !s.ret {
			callOf[s.op] = e
		} else {
			ev[callOf[s.op]].match = e
		}
		switch {
		case !deferrable[s.op]:
			ev[e].prev, ev[tail].next, tail = tail, e, e
		case !s.ret && prevTwin[s.op] < 0:
			ev[e].prev, ev[e].next = dHead, ev[dHead].next
			if ev[dHead].next >= 0 {
				ev[ev[dHead].next].prev = e
			}
			ev[dHead].next = e
		}
	}
	// The second pass at a return looks only at the deferrable calls made before it, and the
	// calls made after it lead the list (newest first), all still in it: none of them was
	// ordered or taken out on the way down (the return the pass stops at moves only later as
	// operations are ordered), and a twin that joins the list takes the place of one called
	// before. So the pass starts after the oldest of them, skipAfter[e] for the return e
	// (dHead when there is none), instead of walking over them: they are the deferrable calls
	// of the history's remainder, so walking over them at every stuck return cost more per
	// operation the longer the history: 5 000 of the checker's 110 000 steps on the synthetic
	// history of 100 000 operations, 2.25 million of its 3.41 million at a million (issue 13).
	skipAfter := make([]int, 2*n+1)
	for e, p := 2*n, dHead; e > 0; e-- {
		skipAfter[e] = p
		if !ev[e].ret && deferrable[ev[e].op] && prevTwin[ev[e].op] < 0 {
			p = e
		}
	}
	// Every change to the lists is logged (an event taken out, or, as ^e, put in) and undone
	// in reverse order when the search backtracks (Knuth's dancing links).
	var undo []int
	unlink := func(e int) {
		ev[ev[e].prev].next = ev[e].next
		if ev[e].next >= 0 {
			ev[ev[e].next].prev = ev[e].prev
		}
		undo = append(undo, e)
	}
	relink := func(e int) {
		ev[ev[e].prev].next = e
		if ev[e].next >= 0 {
			ev[ev[e].next].prev = e
		}
	}
	lift := func(e int) {
		op := ev[e].op
		unlink(e)
		switch t := nextTwin[op]; {
		case !deferrable[op]:
			unlink(ev[e].match)
		case t >= 0:
			c := callOf[t]
			ev[c].prev, ev[c].next = ev[e].prev, ev[e].next
			relink(c)
			undo = append(undo, ^c)
		}
	}
	undoTo := func(mark int) {
		for len(undo) > mark {
			e := undo[len(undo)-1]
			undo = undo[:len(undo)-1]
			if e >= 0 {
				relink(e)
				continue
			}
			e = ^e
			ev[ev[e].prev].next = ev[e].next
			if ev[e].next >= 0 {
				ev[ev[e].next].prev = ev[e].prev
			}
		}
	}
	// A deferrable publication or release changes the state only while its owner holds the
	// lease (step), so the second pass passes over it while another does; and once no
	// acquisition or restore that could give that owner the lease again is left to order
	// (enablers), it cannot take effect anywhere below: it leaves the list until the search
	// backtracks above that point.
	ownersOnly, ownerOf, ownerIdx := make([]bool, n), make([]string, n), make([]int32, n)
	gives := make([]int32, n) // the owner an acquisition or a restore gives the lease to, or -1
	enablers := make([]int32, len(left))
	for i, op := range ops {
		in := op.in
		gives[i] = -1
		switch in.Kind {
		case OpPublish, OpPublishRelease, OpRelease:
			ownersOnly[i], ownerOf[i], ownerIdx[i] = deferrable[i], in.Owner, max(inOwner[i], 0)
		case OpAcquire, OpRestore:
			if id := inOwner[i]; id >= 0 {
				gives[i] = id
				enablers[id]++
			}
		}
	}
	// The generation bound. Generations only grow, but for a restore's: an acquisition takes
	// the next one, and nothing else changes it (after). So an operation that needs the
	// resource at a generation (need: an acquisition granted the one after it; an accepted
	// publication, renewal or release its lease's; a read or a copy the one it returned) can no
	// longer be ordered once the state is past it, unless a restore ordered before it takes
	// the generation back; and neither can the history be completed while that operation is
	// left to order. The second pass therefore passes over a deferrable operation that would
	// take the state past the least need of the operations left to order that return before
	// any restore left to order is called (bound): such a restore cannot come before them.
	// Without it, the search ordered, at a stuck return, one unknown acquisition after another
	// (twins, each taking the next generation) before it backtracked, and again at every level
	// it backtracked through: those left not taking effect accumulate along the history, so
	// the backtracking per operation grew with the history's length (840 backtracks at 100 000
	// operations, 28 834 at a million; with the bound, 42 and 213; issue 13). Until the bound
	// took restores into account, a resource with one had no bound at all, and Redis's torture
	// histories, which all have restores, took 43-213 steps per operation (docs/TORTURE.md).
	const noNeed = math.MaxInt64
	need := make([]int64, n)
	var restores []int // the restores that may take effect, in call order
	for _, i := range byCall {
		if op := ops[i]; op.in.Kind == OpRestore && op.out.Out != OutFailed {
			restores = append(restores, i)
		}
	}
	for i, op := range ops {
		need[i] = noNeed
		switch {
		case op.out.Out != OutOK:
		case op.in.Kind == OpAcquire:
			need[i] = op.out.Gen - 1
		case op.in.Kind == OpShow || op.in.Kind == OpSnapshot:
			need[i] = op.out.Gen
		case op.in.Kind == OpPublish || op.in.Kind == OpPublishRelease || op.in.Kind == OpRenew || op.in.Kind == OpRelease:
			need[i] = op.in.Gen
		}
	}
	// later[e] is the least need of the operations called after the event e. Every operation
	// the search orders is called before the return the second pass stops at, which only moves
	// later as operations are ordered: so the operations called after it are all left to order,
	// those called before it are left if their calls are still in the main list, and boundAt
	// is the least need of every operation left to order that returns before the first restore
	// left to order (restores[k], the first in call order not ordered) is called.
	later := make([]int64, 2*n+1)
	for e, b := 2*n, int64(noNeed); e >= 0; e-- {
		later[e] = b
		if e > 0 && !ev[e].ret {
			b = min(b, need[ev[e].op])
		}
	}
	// With restores[k] left to order (and every restore called before it ordered), the
	// operations that count are called before it: the stuck return lies between the calls of
	// restores[k-1] and restores[k], and beyond the latter nothing counts. laterBefore[k] is
	// later for that stretch, counting only the operations that return before restores[k]'s
	// call; made when first needed. Together they hold about one entry per event.
	laterBefore := make([][]int64, len(restores))
	ordered := make([]bool, n)
	boundAt := func(limit int) int64 {
		k := 0
		for k < len(restores) && ordered[restores[k]] {
			k++
		}
		if k == len(restores) {
			b := later[limit]
			for x := ev[0].next; x != limit; x = ev[x].next {
				b = min(b, need[ev[x].op])
			}
			return b
		}
		lo, hi, t := 0, callOf[restores[k]], ops[restores[k]].call
		if k > 0 {
			lo = callOf[restores[k-1]]
		}
		if limit < lo || limit >= hi {
			return noNeed // nothing left to order both needs a generation and returns before t
		}
		if laterBefore[k] == nil {
			lb := make([]int64, hi-lo+1)
			for e, b := hi, int64(noNeed); e >= lo; e-- {
				lb[e-lo] = b
				if e > 0 && !ev[e].ret && ops[ev[e].op].ret < t {
					b = min(b, need[ev[e].op])
				}
			}
			laterBefore[k] = lb
		}
		b := laterBefore[k][limit-lo]
		for x := ev[0].next; x != limit; x = ev[x].next {
			if ops[ev[x].op].ret < t {
				b = min(b, need[ev[x].op])
			}
		}
		return b
	}
	bound := int64(noNeed)
	order := func(op int, delta int32) {
		for _, id := range mentions[op] {
			if id >= 0 {
				left[id] += delta
			}
		}
		if id := gives[op]; id >= 0 {
			enablers[id] += delta
		}
	}
	var lin1, lin2 uint64
	type key struct{ a, b uint64 }
	// seen holds the (set, state) pairs from which every way on was tried and failed. A pair
	// enters when the search backtracks out of it, not when it descends into it: the pairs
	// still being explored are the path from the root, each with a larger set than the one
	// before, so the search never meets one of them again below it, and pruning is the same
	// as with every pair entered on the way down. A passing history with little backtracking
	// thus leaves the memo nearly empty, where entering every pair made it as large as the
	// resource's history: at a million operations, the map's probing missed the cache at
	// every step (issue 13).
	seen := map[key]struct{}{}
	// seenSets holds the first hash of every set in seen: a step whose set is not in it
	// cannot be in seen, and skips hashing its state (the owner's and the payload's bytes,
	// which at a million operations missed the cache at every step).
	seenSets := map[uint64]struct{}{}
	// seenBits has the bit of every set in seenSets (4 096 bits, by the hash's top 12): a step
	// whose set's bit is clear skips the map. A lookup in a map that has entries costs about 70
	// instructions, in an empty one a few; without the bits, the step cost more once a
	// resource's search had backtracked at all, as every resource's does on a long enough
	// history (issue 13: 32 instructions per lookup at 100 000 operations, 72 at a million).
	var seenBits [64]uint64
	// memoKey is the memo's key for st after the operations ordered (l1, l2): Zobrist hashes
	// of the set, each combined with a hash of the state.
	memoKey := func(l1, l2 uint64, st state) key {
		return key{l1 ^ maphash.Comparable(seed1, st), l2 ^ maphash.Comparable(seed2, st)*0x9e3779b97f4a7c15}
	}
	type frame struct {
		e     int
		state state
		alt   int   // which of the operation's outcomes (step's results) was taken
		limit int   // in the second pass: the return it stopped at
		mark  int   // the undo log's length before
		owner int32 // state's stID
		bound int64 // in the second pass: its bound
	}
	calls := make([]frame, 0, n) // as deep as every operation ordered: grown once
	// stID is the number of st.Owner, -1 when st.Owner is "" or unobservable.
	var stID int32
	// The initial states already searched from. They are kept apart from the memo: below the
	// root the set ordered is never empty, so the search never meets them there.
	initial := map[state]struct{}{}
	res := searchResult{verdict: linearizable, culprit: -1}
	for _, st := range init {
		stID = -1
		if st.Owner != "" && st.Owner != unobservable {
			if stID = idOf(st.Owner); stID < 0 || left[stID] == 0 {
				st.Owner, stID = unobservable, -1
			}
		}
		if _, done := initial[st]; done {
			continue
		}
		initial[st] = struct{}{}
		undoTo(0)
		// Two passes over the operations that may go next: first those that must be ordered
		// (the main list, up to its first return), then the deferrable ones taking effect
		// (their list, up to the calls made before that return), so that the search tries
		// "not yet" (which the deferral makes "not at all" if it lasts) before "now" for them.
		// Both passes offer the same children; only their order changes.
		cur, from, late, limit := ev[0].next, 0, false, 0
		for required > 0 {
			if maxSteps > 0 && res.steps == maxSteps {
				res.verdict = undecided
				return res
			}
			res.steps++
			if res.steps&0xfff == 0 && time.Now().After(deadline) {
				res.verdict = timedOut
				return res
			}
			if late && cur > limit {
				cur, from = ev[cur].next, 0
				continue
			}
			if late && cur < 0 {
				// The return at limit: its operation must have taken effect already, and no
				// choice made so far allows it, with or without the deferrable operations
				// called before it. Undo the latest choice.
				if len(calls) >= res.depth {
					res.depth, res.culprit = len(calls), ev[limit].op
				}
				if len(calls) == 0 {
					break
				}
				// Every way on from (the set ordered, st) has been tried: remember it.
				seen[memoKey(lin1, lin2, st)] = struct{}{}
				seenSets[lin1] = struct{}{}
				seenBits[lin1>>58] |= 1 << (lin1 >> 52 & 63)
				top := calls[len(calls)-1]
				calls = calls[:len(calls)-1]
				cur, st, stID, from, limit, bound = top.e, top.state, top.owner, top.alt+1, top.limit, top.bound
				op := ev[cur].op
				late = deferrable[op]
				lin1, lin2 = lin1^z1[op], lin2^z2[op]
				ordered[op] = false
				if !deferrable[op] {
					required++
				}
				order(op, 1)
				undoTo(top.mark)
				continue
			}
			e := ev[cur]
			if e.ret {
				// A return whose call is still in the list: try the deferrable operations.
				cur, from, late, limit = ev[skipAfter[cur]].next, 0, true, cur
				if bounded {
					bound = boundAt(limit)
				}
				continue
			}
			if t := prevTwin[e.op]; t >= 0 && !ordered[t] {
				cur, from = e.next, 0
				continue
			}
			if ownersOnly[e.op] && ownerOf[e.op] != st.Owner {
				if enablers[ownerIdx[e.op]] == 0 {
					unlink(cur)
				}
				cur, from = e.next, 0
				continue
			}
			op := ops[e.op]
			in := op.in
			nexts := after(st, in, op.out)
			descended := false
			order(e.op, -1)
			for a := from; a < nexts.n; a++ {
				next := nexts.s[a]
				if deferrable[e.op] && next == st {
					continue // not taking effect: ordered last
				}
				if deferrable[e.op] && bounded && next.Gen > bound {
					res.pruned++
					continue // an operation called before the stuck return needs a generation passed
				}
				// The model gives the next state the operation's owner, keeps the state's, or
				// clears it: the owner's number is known either way.
				nextID := int32(-1)
				if id := inOwner[e.op]; id >= 0 && next.Owner == in.Owner {
					if left[id] == 0 {
						next.Owner = unobservable
					} else {
						nextID = id
					}
				} else if next.Owner != "" && next.Owner != unobservable { // st.Owner
					if stID < 0 || left[stID] == 0 {
						next.Owner = unobservable
					} else {
						nextID = stID
					}
				}
				if l1 := lin1 ^ z1[e.op]; seenBits[l1>>58]&(1<<(l1>>52&63)) != 0 {
					if _, maybe := seenSets[l1]; maybe {
						if _, done := seen[memoKey(l1, lin2^z2[e.op], next)]; done {
							continue
						}
					}
				}
				lin1, lin2 = lin1^z1[e.op], lin2^z2[e.op]
				ordered[e.op] = true
				if !deferrable[e.op] {
					required--
				}
				calls = append(calls, frame{cur, st, a, limit, len(undo), stID, bound})
				st, stID = next, nextID
				lift(cur)
				cur, from, late, descended = ev[0].next, 0, false, true
				break
			}
			if !descended {
				order(e.op, 1)
				cur, from = e.next, 0
			}
		}
		if required == 0 {
			break
		}
	}
	res.memo = len(seen)
	if required > 0 {
		res.verdict = illegal
		return res
	}
	res.depth = len(calls)
	res.order = make([]int, len(calls))
	for i, f := range calls {
		res.order[i] = ev[f.e].op
	}
	for i := range n {
		if !ordered[i] {
			res.order = append(res.order, i) // deferrable, not taking effect
		}
	}
	return res
}

// stamp is an operation's call or return, at its time.
type stamp struct {
	op  int
	ret bool
	t   int64
}

// stampOrder puts the calls and returns of ops in time order, calls before returns at the
// same instant (concurrent), and otherwise in the order of ops: the order of a stable sort of
// (call 0, return 0, call 1, ...) by (time, call first), which the search used until issue 13.
// byCall are the operations in the order of their calls, ties in the order of ops. A
// comparison sort made the check grow faster than the history (the stable sort's in-place
// merges are O(n log² n)); the calls and the returns are each put in order by timeOrder, in
// linear time, and then merged.
func stampOrder(ops []modelOp) (stamps []stamp, byCall []int) {
	n := len(ops)
	times := make([]int64, n)
	for i, op := range ops {
		times[i] = op.call
	}
	byCall = timeOrder(times)
	for i, op := range ops {
		times[i] = op.ret
	}
	byRet := timeOrder(times)
	stamps = make([]stamp, 0, 2*n)
	c, r := 0, 0
	for c < n || r < n {
		if c < n && (r == n || ops[byCall[c]].call <= ops[byRet[r]].ret) {
			stamps = append(stamps, stamp{byCall[c], false, ops[byCall[c]].call})
			c++
			continue
		}
		stamps = append(stamps, stamp{byRet[r], true, ops[byRet[r]].ret})
		r++
	}
	return stamps, byCall
}

// timeOrder returns the indices of ts ordered by ts, equal times in the order of their
// indices, in time linear in len(ts). The checker's calls come in order (one pass), and its
// returns nearly so, each out of place by about the number of operations open at once, but
// for those left unknown, which all return at the history's end: they go last, and the others
// are put in order by an insertion sort, O(n + inversions), which gives way to a radix sort
// when the inversions are more than a few per time.
func timeOrder(ts []int64) []int {
	n := len(ts)
	idx := make([]int, 0, n)
	sorted, hi := true, int64(math.MinInt64)
	for i, t := range ts {
		sorted = sorted && (i == 0 || t >= ts[i-1])
		hi = max(hi, t)
	}
	for i, t := range ts {
		if sorted || t < hi {
			idx = append(idx, i)
		}
	}
	if sorted {
		return idx
	}
	rest := idx
	for i, t := range ts {
		if t == hi {
			idx = append(idx, i)
		}
	}
	if !insertionOrder(rest, ts, 4*len(rest)) {
		radixOrder(rest, ts)
	}
	return idx
}

// insertionOrder sorts idx by ts[idx[k]] by insertion, stably, unless it takes more than
// moves moves: it then stops after an insertion, with idx still ordered as far as it went
// (equal times in their first order throughout), and returns false.
func insertionOrder(idx []int, ts []int64, moves int) bool {
	for k := 1; k < len(idx); k++ {
		x := idx[k]
		t := ts[x]
		j := k
		for ; j > 0 && ts[idx[j-1]] > t; j-- {
			idx[j] = idx[j-1]
		}
		idx[j] = x
		if moves -= k - j; moves < 0 {
			return false
		}
	}
	return true
}

// radixBits is the width of a digit of radixOrder: 2048 counters, which stay in the cache.
const radixBits = 11

// radixOrder sorts idx by ts[idx[k]], equal times in their order in idx: a least significant
// digit first radix sort of the times less the least of them, stable, in time linear in
// len(idx) (a pass per 11 bits of the times' range, skipped where all share a digit).
func radixOrder(idx []int, ts []int64) {
	n := len(idx)
	if n == 0 {
		return
	}
	lo, hi := ts[idx[0]], ts[idx[0]]
	for _, i := range idx {
		lo, hi = min(lo, ts[i]), max(hi, ts[i])
	}
	type item struct {
		key uint64
		i   int
	}
	a, b := make([]item, n), make([]item, n)
	for k, i := range idx {
		a[k] = item{uint64(ts[i] - lo), i} // exact: where int64's difference wraps, uint64's is the same bits
	}
	span := uint64(hi - lo)
	var count [1 << radixBits]int
	for shift := 0; shift < 64 && span>>shift > 0; shift += radixBits {
		clear(count[:])
		for _, it := range a {
			count[it.key>>shift&(1<<radixBits-1)]++
		}
		if count[a[0].key>>shift&(1<<radixBits-1)] == n {
			continue // every time has this digit
		}
		sum := 0
		for d, c := range count {
			count[d] = sum
			sum += c
		}
		for _, it := range a {
			d := it.key >> shift & (1<<radixBits - 1)
			b[count[d]] = it
			count[d]++
		}
		a, b = b, a
	}
	for k, it := range a {
		idx[k] = it.i
	}
}
