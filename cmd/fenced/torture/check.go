package torture

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Invariant names, numbered as in CORRECTNESS.md.
const (
	InvLinearizable     = "model: every resource's history is linearizable against the protocol model"
	InvUniqueTokens     = "1 unique tokens: no two acknowledged acquisitions share a generation"
	InvRealTimeOrder    = "2 real-time order: an acquisition that finished before another started has the smaller token"
	InvFence            = "3 fence: nothing carrying a smaller token is accepted after a larger acquisition was acknowledged"
	InvOnePublication   = "4a at most one accepted publication per generation"
	InvPublishedGrows   = "4b the published generation never decreases (publications and reads, in real time)"
	InvPayloadBelongs   = "5 the payload belongs to the publication that set the published generation"
	InvLeaseExists      = "6 an accepted renewal, publication or release carries an acquisition that was made"
	InvNoRevival        = "6 no renewal or publication that waited on a row lock (rowlock fault) past its lease's expiry is accepted"
	InvReadsMonotonic   = "9 reads never go back in time (per reader)"
	InvIdentityPerAcq   = "12 identity per acquisition: no owner identity is used by two acquisitions"
	InvGate             = "3 at a participating service (--gate): it accepts no write carrying a token older than one whose holder was ready (fenced, or acquired when nobody fences) before the write was sent"
	maxExcerpt          = 40
	defaultCheckTimeout = time.Minute
	flaggedCheckTimeout = 5 * time.Second
)

// Invariants lists what Check verifies, in order.
var Invariants = []string{InvLinearizable, InvUniqueTokens, InvRealTimeOrder, InvFence, InvOnePublication,
	InvPublishedGrows, InvPayloadBelongs, InvLeaseExists, InvNoRevival, InvReadsMonotonic, InvIdentityPerAcq, InvGate}

// NotShown lists the invariants a history of this kind cannot show, and why.
var NotShown = []string{
	"6 (renewal never revives an EXPIRED lease): the history has no database clock, so a renewal accepted after a lease expired with nobody taking over looks like a renewal just in time; only revival after a successor's acquisition is checked (as 3), and, with the rowlock fault, revival by a statement that waited on the row lock until after the expiry",
	"7 durability: shown only when a restart ran; then every read after it must still be explained by the model, which includes the acknowledged generations",
	"8 rollback detection: no fault restores an older copy (a later issue)",
	"10 expiry by the database's clock alone: not visible in a history; the clock fault (SQLite) jumps that clock and the other invariants must still hold",
	"11 the holder's trust window: the workers deliberately ignore it, so that stale writes reach the database",
	"13 failed means not applied: refusals are checked by the model (a refused publication that took effect would show in later reads); replies dropped after a commit are recorded as unknown",
	"14 liveness: not checked (a busy answer is always allowed, since the checker cannot see expiry)",
}

// Violation is one broken invariant with the operations that show it.
type Violation struct {
	Invariant string
	Resource  string
	Message   string
	Involved  []int // operation indexes
	Excerpt   []int // Involved and the operations concurrent with them, by call time
	More      int   // concurrent operations left out of Excerpt
}

// InvariantResult is one invariant's verdict.
type InvariantResult struct {
	Name       string
	Checked    int // operations or pairs examined
	Violations int
	Note       string // e.g. "timed out"
}

// Result is the checker's verdict on a history.
type Result struct {
	Ops, Unknown int
	Counts       map[string]map[string]int // kind → outcome → count
	Invariants   []InvariantResult
	Violations   []Violation
	Inconclusive []string // resources whose linearizability check timed out
	Duration     time.Duration
	// Linearizations holds porcupine's information per resource, for its visualization.
	Linearizations map[string]porcupine.LinearizationInfo
}

// OK reports whether nothing was violated.
func (r *Result) OK() bool { return len(r.Violations) == 0 }

// Check holds the history to every invariant it can show. init is each resource's state
// before the workers started (the zero state when missing); timeout bounds the model check of
// each resource (0: one minute).
func Check(h *History, init map[string]State, timeout time.Duration) *Result {
	if timeout <= 0 {
		timeout = defaultCheckTimeout
	}
	start := time.Now()
	r := &Result{Counts: map[string]map[string]int{}, Linearizations: map[string]porcupine.LinearizationInfo{}}
	for _, op := range h.Ops {
		r.Ops++
		if op.Unknown() {
			r.Unknown++
		}
		if r.Counts[op.Kind] == nil {
			r.Counts[op.Kind] = map[string]int{}
		}
		r.Counts[op.Kind][op.Out]++
	}
	c := &checker{h: h, r: r, res: map[string]*InvariantResult{}}
	for _, name := range Invariants {
		c.res[name] = &InvariantResult{Name: name}
	}
	fencing := false
	for _, op := range h.Ops {
		fencing = fencing || op.Kind == OpFence
	}
	for _, res := range h.Resources() {
		var ops, withGate []*Op
		for _, op := range h.Ops {
			if op.Resource == res {
				withGate = append(withGate, op)
				if !op.Gate() { // the gate's operations are checked apart, not by the model
					ops = append(ops, op)
				}
			}
		}
		c.gateTokens(res, withGate, fencing)
		c.tokens(res, ops)
		c.publications(res, ops)
		c.payloads(res, ops)
	}
	c.rowLocks()
	c.readers()
	c.identities()
	for _, res := range h.Resources() {
		var ops []*Op
		for _, op := range h.Ops {
			if op.Resource == res && !op.Gate() {
				ops = append(ops, op)
			}
		}
		// Proving that no order exists can take porcupine a long time when many outcomes are
		// unknown; where the direct checks already found a violation it gets a short budget.
		budget, flagged := timeout, false
		for _, v := range r.Violations {
			flagged = flagged || v.Resource == res
		}
		if flagged {
			budget = min(timeout, flaggedCheckTimeout)
		}
		c.linearizable(res, ops, init[res].model(), budget, flagged)
	}
	for _, name := range Invariants {
		r.Invariants = append(r.Invariants, *c.res[name])
	}
	r.Duration = time.Since(start)
	return r
}

// State is a resource's row before the run, as the parent read it.
type State struct {
	Generation          int64
	Owner               string
	PublishedGeneration int64
	Payload             string
}

func (s State) model() state {
	return state{Gen: s.Generation, Owner: s.Owner, Pub: s.PublishedGeneration, Payload: s.Payload}
}

type checker struct {
	h   *History
	r   *Result
	res map[string]*InvariantResult
}

func (c *checker) violate(inv, resource, msg string, involved ...*Op) {
	c.res[inv].Violations++
	v := Violation{Invariant: inv, Resource: resource, Message: msg}
	for _, op := range involved {
		v.Involved = append(v.Involved, op.Index)
	}
	v.Excerpt, v.More = c.excerpt(involved)
	c.r.Violations = append(c.r.Violations, v)
}

// excerpt is the involved operations and those on the same resource concurrent with them:
// what one needs to see the violation. An unknown operation's interval is cut one second
// after its call, as otherwise it is concurrent with everything after it.
func (c *checker) excerpt(involved []*Op) ([]int, int) {
	in := map[int]bool{}
	for _, op := range involved {
		in[op.Index] = true
	}
	end := func(op *Op) int64 {
		if op.Unknown() {
			return min(op.Return, op.Call+int64(time.Second))
		}
		return op.Return
	}
	var extra []int
	for _, op := range c.h.Ops {
		if in[op.Index] {
			continue
		}
		for _, inv := range involved {
			if op.Resource == inv.Resource && op.Call <= end(inv) && inv.Call <= end(op) {
				extra = append(extra, op.Index)
				break
			}
		}
	}
	more := 0
	if room := maxExcerpt - len(involved); len(extra) > room {
		more = len(extra) - max(room, 0)
		extra = extra[:max(room, 0)]
	}
	out := append(extra, func() []int {
		var ids []int
		for id := range in {
			ids = append(ids, id)
		}
		return ids
	}()...)
	sort.Ints(out)
	return out, more
}

// linearizable runs porcupine on one resource. When the history is not linearizable, the
// operation reported is the first, by return time, of those outside porcupine's longest
// partial linearization: it had to take effect before it returned, and no order allowed it.
// It is shown with the last acquisition and publication acknowledged before its call.
func (c *checker) linearizable(res string, ops []*Op, init state, timeout time.Duration, flagged bool) {
	ir := c.res[InvLinearizable]
	ir.Checked += len(ops)
	m := model(init)
	result, info := porcupine.CheckOperationsVerbose(m, porcupineOps(c.h, ops), timeout)
	c.r.Linearizations[res] = info
	switch result {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		if flagged {
			ir.Note = addNote(ir.Note, fmt.Sprintf("not finished on %s within %s, where direct checks had already found violations", res, timeout))
			return
		}
		c.r.Inconclusive = append(c.r.Inconclusive, res)
		ir.Note = addNote(ir.Note, "timed out on "+res)
		return
	}
	linearized := map[*Op]bool{}
	var longest []porcupine.Operation
	for _, partition := range info.PartialLinearizationsOperations() {
		for _, lin := range partition {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	for _, op := range longest {
		linearized[op.Metadata.(*Op)] = true
	}
	var culprit *Op
	for _, op := range ops {
		if !linearized[op] && !op.Unknown() && (culprit == nil || op.Return < culprit.Return) {
			culprit = op
		}
	}
	if culprit == nil {
		c.violate(InvLinearizable, res, "no order of the operations is allowed by the model", ops[0])
		return
	}
	involved := []*Op{culprit}
	var lastAcq, lastPub *Op
	for _, op := range ops {
		if op.Return >= culprit.Call || op.Out != OutOK || op == culprit {
			continue
		}
		switch op.Kind {
		case OpAcquire:
			lastAcq = op
		case OpPublish, OpPublishRelease:
			lastPub = op
		}
	}
	for _, op := range []*Op{lastAcq, lastPub} {
		if op != nil {
			involved = append(involved, op)
		}
	}
	c.violate(InvLinearizable, res, fmt.Sprintf(
		"no order of the operations explains #%d %s → %s (%d of the %d operations on %s could be ordered before it; "+
			"shown with the last acquisition and publication acknowledged before its call)",
		culprit.Index, culprit.Kind, culprit.Out, len(longest), len(ops), res), involved...)
}

// tokens checks invariants 1, 2, 3 and 6 on one resource.
func (c *checker) tokens(res string, ops []*Op) {
	var acqs []*Op
	made := map[string]bool{} // owner/generation of acquisitions that were or may have been made
	byGen := map[int64]*Op{}
	for _, op := range ops {
		if op.Kind != OpAcquire {
			continue
		}
		if op.Out == OutOK {
			acqs = append(acqs, op)
			made[fmt.Sprint(op.Owner, "/", op.Gen)] = true
			c.res[InvUniqueTokens].Checked++
			if prev := byGen[op.Gen]; prev != nil {
				c.violate(InvUniqueTokens, res, fmt.Sprintf("two acquisitions were granted generation %d", op.Gen), prev, op)
			} else {
				byGen[op.Gen] = op
			}
		}
	}
	// Sweep in call order, knowing the largest token acknowledged before each call.
	byReturn := append([]*Op(nil), acqs...)
	sort.Slice(byReturn, func(i, j int) bool { return byReturn[i].Return < byReturn[j].Return })
	var top *Op
	k := 0
	advance := func(t int64) {
		for ; k < len(byReturn) && byReturn[k].Return < t; k++ {
			if top == nil || byReturn[k].Gen > top.Gen {
				top = byReturn[k]
			}
		}
	}
	for _, op := range ops { // ops are in call order
		advance(op.Call)
		switch {
		case op.Kind == OpAcquire && op.Out == OutOK:
			c.res[InvRealTimeOrder].Checked++
			if top != nil && top.Gen >= op.Gen {
				c.violate(InvRealTimeOrder, res, fmt.Sprintf(
					"generation %d was granted to an acquisition that started after generation %d had been acknowledged",
					op.Gen, top.Gen), top, op)
			}
		case op.Write() && op.Out == OutOK:
			c.res[InvFence].Checked++
			c.res[InvLeaseExists].Checked++
			if top != nil && top.Gen > op.Gen {
				c.violate(InvFence, res, fmt.Sprintf(
					"%s with generation %d was accepted after generation %d had been acknowledged",
					op.Kind, op.Gen, top.Gen), top, op)
			}
			if !made[fmt.Sprint(op.Owner, "/", op.Gen)] && !c.maybeMade(ops, op) {
				c.violate(InvLeaseExists, res, fmt.Sprintf(
					"%s was accepted for owner %s generation %d, which no acquisition was granted",
					op.Kind, short(op.Owner), op.Gen), op)
			}
		}
	}
}

// maybeMade reports whether an acquisition with an unknown outcome carried op's owner.
func (c *checker) maybeMade(ops []*Op, op *Op) bool {
	for _, a := range ops {
		if a.Kind == OpAcquire && a.Unknown() && a.Owner == op.Owner {
			return true
		}
	}
	return false
}

// publications checks invariant 4 on one resource: one accepted publication per generation,
// and a published generation that never decreases in real time, as seen by publications and
// reads.
func (c *checker) publications(res string, ops []*Op) {
	byGen := map[int64]*Op{}
	type known struct {
		at  int64
		pub int64
		op  *Op
	}
	var facts []known // "the published generation was at least pub at time at"
	for _, op := range ops {
		switch {
		case (op.Kind == OpPublish || op.Kind == OpPublishRelease) && op.Out == OutOK:
			c.res[InvOnePublication].Checked++
			if prev := byGen[op.Gen]; prev != nil {
				c.violate(InvOnePublication, res, fmt.Sprintf("generation %d published twice", op.Gen), prev, op)
			} else {
				byGen[op.Gen] = op
			}
			facts = append(facts, known{op.Return, op.Gen, op})
		case op.Read() && op.Out == OutOK:
			facts = append(facts, known{op.Return, op.ReadPub, op})
		}
	}
	sort.Slice(facts, func(i, j int) bool { return facts[i].at < facts[j].at })
	var top *known
	k := 0
	for _, op := range ops {
		for ; k < len(facts) && facts[k].at < op.Call; k++ {
			if top == nil || facts[k].pub > top.pub {
				top = &facts[k]
			}
		}
		if op.Out != OutOK || top == nil {
			continue
		}
		switch {
		case op.Kind == OpPublish || op.Kind == OpPublishRelease:
			c.res[InvPublishedGrows].Checked++
			if op.Gen <= top.pub {
				c.violate(InvPublishedGrows, res, fmt.Sprintf(
					"a publication of generation %d was accepted after the published generation was %d",
					op.Gen, top.pub), top.op, op)
			}
		case op.Read():
			c.res[InvPublishedGrows].Checked++
			if op.ReadPub < top.pub {
				c.violate(InvPublishedGrows, res, fmt.Sprintf(
					"a read returned published generation %d after it had been %d", op.ReadPub, top.pub), top.op, op)
			}
		}
	}
}

// payloads checks invariant 5: what a read returns was published, by that generation.
func (c *checker) payloads(res string, ops []*Op) {
	type pub struct {
		gen     int64
		payload string
	}
	published := map[pub]bool{}
	sizes := map[int64]map[int64]bool{}
	for _, op := range ops {
		if (op.Kind == OpPublish || op.Kind == OpPublishRelease) && (op.Out == OutOK || op.Unknown()) {
			published[pub{op.Gen, op.Payload}] = true
			if sizes[op.Gen] == nil {
				sizes[op.Gen] = map[int64]bool{}
			}
			sizes[op.Gen][int64(len(op.Payload))] = true
		}
	}
	for _, op := range ops {
		if op.Out != OutOK || op.ReadPub == 0 {
			continue
		}
		switch op.Kind {
		case OpGet:
			c.res[InvPayloadBelongs].Checked++
			if !published[pub{op.ReadPub, op.Payload}] {
				c.violate(InvPayloadBelongs, res, fmt.Sprintf(
					"get returned payload %s as generation %d, which no publication of that generation carried",
					op.Payload, op.ReadPub), op)
			}
		case OpShow:
			c.res[InvPayloadBelongs].Checked++
			if !sizes[op.ReadPub][op.PayloadBytes] {
				c.violate(InvPayloadBelongs, res, fmt.Sprintf(
					"show returned a %d-byte payload for generation %d, which no publication of that generation had",
					op.PayloadBytes, op.ReadPub), op)
			}
		}
	}
}

// rowLocks checks the rowlock fault's part of invariant 6. While the nemesis held a resource's
// row lock, from Time (the lock held and the lease read) to EndTime (just before the lock was
// released), nothing could change the row: a renewal or a publication of the lease it read,
// called in that interval, took effect after EndTime, if at all. When the lease had expired by
// then (Until < EndTime), accepting it would act on an expired lease.
func (c *checker) rowLocks() {
	for _, e := range c.h.Events {
		if e.Event != FaultRowLock || e.Owner == "" || e.Until >= e.EndTime {
			continue
		}
		for _, op := range c.h.Ops {
			if op.Resource != e.Resource || op.Owner != e.Owner || op.Gen != e.Gen ||
				op.Call <= e.Time || op.Call >= e.EndTime {
				continue
			}
			if op.Kind != OpRenew && op.Kind != OpPublish && op.Kind != OpPublishRelease {
				continue
			}
			c.res[InvNoRevival].Checked++
			if op.Out == OutOK {
				c.violate(InvNoRevival, op.Resource, fmt.Sprintf(
					"%s of generation %d waited on a row lock held from %.3fs to %.3fs and was accepted, though the lease expired by %.3fs",
					op.Kind, op.Gen, c.h.Seconds(e.Time), c.h.Seconds(e.EndTime), c.h.Seconds(e.Until)), op)
			}
		}
	}
}

// readers checks invariant 9: each process's reads of a resource only go forward.
func (c *checker) readers() {
	type key struct{ proc, res string }
	last := map[key]*Op{}
	for _, op := range c.h.Ops { // a process runs one operation at a time, so call order is its order
		if !op.Read() || op.Out != OutOK {
			continue
		}
		c.res[InvReadsMonotonic].Checked++
		k := key{op.Proc, op.Resource}
		if prev := last[k]; prev != nil {
			if op.ReadPub < prev.ReadPub || (op.Kind == OpShow && prev.Kind == OpShow && op.ReadGen < prev.ReadGen) {
				c.violate(InvReadsMonotonic, op.Resource, fmt.Sprintf("%s read an older state than it had read before", op.Proc), prev, op)
			}
		}
		last[k] = op
	}
}

// identities checks invariant 12: every acquisition used a fresh owner identity.
func (c *checker) identities() {
	seen := map[string]*Op{}
	for _, op := range c.h.Ops {
		if op.Kind != OpAcquire {
			continue
		}
		c.res[InvIdentityPerAcq].Checked++
		if prev := seen[op.Owner]; prev != nil {
			c.violate(InvIdentityPerAcq, op.Resource, fmt.Sprintf("owner %s was used by two acquisitions", short(op.Owner)), prev, op)
		}
		seen[op.Owner] = op
	}
}

func addNote(note, s string) string {
	if note == "" {
		return s
	}
	return note + "; " + s
}
