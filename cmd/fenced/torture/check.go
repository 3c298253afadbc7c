package torture

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Invariant names, numbered as in docs/INVARIANTS.md.
const (
	InvLinearizable     = "model: every resource's history is linearizable against the protocol model"
	InvUniqueTokens     = "1 unique tokens: no two acknowledged acquisitions share a token (epoch, generation)"
	InvRealTimeOrder    = "2 real-time order: an acquisition that finished before another started has the smaller token"
	InvFence            = "3 fence: nothing carrying a smaller token is accepted after a larger acquisition was acknowledged"
	InvOnePublication   = "4a at most one accepted publication per token"
	InvPublishedGrows   = "4b the published generation never decreases (publications and reads, in real time), except across a restore"
	InvPayloadBelongs   = "5 the payload belongs to the publication that set the published generation"
	InvLeaseExists      = "6 an accepted renewal, publication or release carries an acquisition that was made"
	InvNoRevival        = "6 no renewal or publication that waited on a row lock (rowlock fault) past its lease's expiry is accepted"
	InvRenewClock       = "6 no renewal is accepted at or after its lease's expiry, both read on the database's clock from the replies"
	InvBumpFences       = "8 after an epoch bump is acknowledged, no acquisition gets an older epoch and nothing carrying an older epoch is accepted"
	InvLiveness         = "14 liveness: no acquisition is answered busy by a lease that had expired, on the database's clock, more than the bound before the request"
	InvReadsMonotonic   = "9 reads never go back in time (per reader), except across a restore"
	InvIdentityPerAcq   = "12 identity per acquisition: no owner identity is used by two acquisitions"
	InvGate             = "3 at a participating service (--gate) or an Azure blob (--azure): it accepts no write carrying a token older than one whose holder was ready (fenced, or acquired when nobody fences) before the write was sent"
	maxExcerpt          = 40
	defaultCheckTimeout = time.Minute
	flaggedCheckTimeout = 5 * time.Second
)

// The model search's budgets per resource, in steps (search.go), beside its time budget, so
// that a verdict does not depend on the machine's load alone. A passing history with bounded
// concurrency takes about one step per operation; bursts of unknown outcomes take up to a
// few hundred per operation (TestTwinsWithNamedUnknownsDecide); proving a history illegal
// may take time exponential in the operations open at once. A step takes 0.1-0.3 µs, so the
// full budget (tens of seconds on a quiet machine) rarely runs out before the time budget
// does on a loaded one. A resource the direct checks already flagged gets the small budget
// (TestUnfencedControlCheckIsBounded): its verdict is a failure either way.
const (
	searchStepsBase   = 1 << 26
	searchStepsPerOp  = 1 << 12
	flaggedStepsBase  = 1 << 16
	flaggedStepsPerOp = 64
)

// Invariants lists what Check verifies, in order.
var Invariants = []string{InvLinearizable, InvUniqueTokens, InvRealTimeOrder, InvFence, InvOnePublication,
	InvPublishedGrows, InvPayloadBelongs, InvLeaseExists, InvNoRevival, InvRenewClock, InvBumpFences, InvReadsMonotonic,
	InvIdentityPerAcq, InvLiveness, InvGate}

// LivenessBound is how long after a lease's expiry on the database's clock an acquisition may
// still be answered busy by it: the uncertainty of mapping the database's clock onto the
// history's is added to it per run (see checker.clockMap).
const LivenessBound = 50 * time.Millisecond

// NotShown lists the invariants a history of this kind cannot show, and why.
var NotShown = []string{
	"6 (renewal never revives an expired lease): checked for renewals from the engine's clock in the replies; a publication's reply carries no clock, so a publication accepted after its lease expired with nobody taking over is seen only across a rowlock fault",
	"7 durability: shown only across a restart, after which every read must still be explained by the model, which holds the acknowledged generations; crash durability only when the restart crashes the server (a --restart-cmd with kill -9, as make torture's Redis and etcd and the isolated PostgreSQL and MariaDB runs use): the built-in restarts (pg_ctlcluster restart, MariaDB's SHUTDOWN) are clean shutdowns; a restore is a rollback by design and shows nothing about durability",
	"10 expiry by the database's clock alone: seen through 6 and 14 on the engine's clock; the clock fault (SQLite) jumps that clock and the other invariants must still hold",
	"11 the holder's trust window: the workers deliberately ignore it, so that stale writes reach the database",
	"13 failed means not applied: refusals are checked by the model (a refused publication that took effect would show in later reads); a refused renewal that took effect is invisible, since a renewal changes nothing the model follows; replies dropped after a commit are recorded as unknown",
	"14 liveness beyond busy answers: a worker that never comes back (killed) is not a liveness failure; a busy answer naming no expiry (a driver that reports none) is not checked",
	"15 nothing the caller controls is trusted: a property of the routines, not of a history (the workers never forge a session); covered by the backends' tests: PostgreSQL TestForgedIncarnationSettingIgnored and TestGrantedRoleCannotBypass, MariaDB TestForgedSessionTimestampIgnored and TestGrantRefusesTemporaryTables (no PostgreSQL test yet shadows a table with a temporary one inside the SECURITY DEFINER routines, whose search_path puts pg_temp last)",
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
	Inconclusive []string // resources whose model check did not finish (time or steps): never a pass
	Duration     time.Duration
	// SearchSteps is the steps the model search took, over every resource (search.go).
	SearchSteps int
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
	c := &checker{h: h, r: r, res: map[string]*InvariantResult{}, restores: map[string][]*Op{},
		made: newOwnerMap[int64, struct{}](len(h.Owners)), maybeMade: newOwnerMap[struct{}, struct{}](len(h.Owners)),
		leases: newOwnerMap[token, renewed](len(h.Owners)), local: newOwnerMap[struct{}, int32](len(h.Owners))}
	for _, name := range Invariants {
		c.res[name] = &InvariantResult{Name: name}
	}
	fencing := false
	// Each resource's operations, indexed by its number (Op.ResN).
	byRes, withGate := make([][]*Op, len(h.Resources())), make([][]*Op, len(h.Resources()))
	// One pass over the history: at a million operations, each pass reads them from memory.
	for _, op := range h.Ops {
		r.Ops++
		if op.Unknown() {
			r.Unknown++
		}
		if r.Counts[op.Kind] == nil {
			r.Counts[op.Kind] = map[string]int{}
		}
		r.Counts[op.Kind][op.Out]++
		fencing = fencing || op.Kind == OpFence
		withGate[op.ResN] = append(withGate[op.ResN], op)
		if !op.Gate() { // the gate's operations are checked apart, not by the model
			byRes[op.ResN] = append(byRes[op.ResN], op)
		}
		if op.Kind == OpRestore && op.Out != OutFailed {
			c.restores[op.Resource] = append(c.restores[op.Resource], op)
		}
	}
	// The checks across resources first, then each resource's direct checks and its model
	// check one after the other, while its operations are still in the caches (with a million
	// operations, a pass over the history reads them from memory). The violations are reported
	// in the order of the checks as listed in TORTURE.md: every resource's direct checks, the
	// checks across resources, then the model's.
	c.rowLocks()
	c.readers()
	c.identities()
	c.liveness()
	across := r.Violations
	flagged := map[string]bool{}
	for _, v := range across {
		flagged[v.Resource] = true
	}
	var direct, lin []Violation
	bumps := selfBumps(h)
	for n, res := range h.Resources() {
		ops := byRes[n]
		r.Violations = direct
		c.gateTokens(res, withGate[n], fencing)
		c.cops = compact(c.cops[:0], ops)
		c.tokens(res, ops, c.cops)
		c.bumps(res, ops, c.cops)
		c.renewClock(res, ops, c.cops)
		c.publications(res, ops, c.cops)
		c.payloads(res, ops, c.cops)
		flagged[res] = flagged[res] || len(r.Violations) > len(direct)
		direct = r.Violations
		// Proving that no order exists can take the search time exponential in the operations
		// open at once; where the direct checks already found a violation the model adds
		// little, and it gets a short budget.
		budget := timeout
		if flagged[res] {
			budget = min(timeout, flaggedCheckTimeout)
		}
		r.Violations = lin
		c.linearizable(res, withSelfBumps(ops, bumps, res), init[res].model(), budget, flagged[res])
		lin = r.Violations
	}
	r.Violations = append(append(direct, across...), lin...)
	for _, name := range Invariants {
		r.Invariants = append(r.Invariants, *c.res[name])
	}
	r.Duration = time.Since(start)
	return r
}

// selfBumps are the model's operations on res for the restarts after which the engine bumps
// its epoch by itself (Record.SelfBump: Redis, whose scripts bump when the server's run id
// changed). That bump frees every lease held across the restart: their holders' releases are
// refused from then on. It happens at the first lease-carrying request the restarted server
// runs, on whichever resource: no earlier than the restart's start, and no later than the
// return of the first such request called after the restart ended that got a definite answer
// (every lease-carrying script records the bump before it answers). With no such request the
// bump may or may not have happened by the end of the history. The operations are the
// model's only: the direct checks do not see them (an acquisition after it still shows a
// larger epoch, and a write after it carrying the old one is refused by the model).
// Each is the same for every resource; the checker adds a copy to each (Index -1: they are
// not in History.Ops, and are never reported as a violation's culprit).
func selfBumps(h *History) []Op {
	var out []Op
	for _, e := range h.Events {
		if e.Event != FaultRestart || !e.SelfBump {
			continue
		}
		op := Op{Index: -1, Proc: "engine", Kind: OpSelfBump, Call: e.Time, Return: h.End, Out: OutUnknown}
		for _, o := range h.Ops {
			if o.Call >= e.EndTime && o.Return < op.Return && answeredByScript(o) {
				op.Return, op.Out = o.Return, OutOK
			}
		}
		out = append(out, op)
	}
	return out
}

// withSelfBumps is ops with a copy of each of bumps on res.
func withSelfBumps(ops []*Op, bumps []Op, res string) []*Op {
	if len(bumps) == 0 {
		return ops
	}
	out := append(make([]*Op, 0, len(ops)+len(bumps)), ops...)
	for _, b := range bumps {
		b.Resource = res
		out = append(out, &b)
	}
	return out
}

// answeredByScript reports whether op is a lease-carrying request the engine ran and answered.
func answeredByScript(op *Op) bool {
	switch op.Kind {
	case OpAcquire:
		return op.Out == OutOK || op.Out == OutBusy || op.Out == OutNotFound
	case OpRenew, OpPublish, OpPublishRelease, OpRelease:
		return op.Out == OutOK || op.Out == OutRefused
	}
	return false
}

// State is a resource's row before the run, as the parent read it.
type State struct {
	Epoch               int64 // the store's epoch
	Generation          int64
	Owner               string
	PublishedGeneration int64
	Payload             string
}

func (s State) model() state {
	return state{Epoch: s.Epoch, Gen: s.Generation, Owner: s.Owner, Pub: s.PublishedGeneration, Payload: s.Payload}
}

type checker struct {
	h        *History
	r        *Result
	res      map[string]*InvariantResult
	restores map[string][]*Op // per resource
	// Every operation per resource in call order, and the longest interval among them, for
	// excerpts (made at the first violation).
	byRes map[string][]*Op
	span  map[string]int64
	// Tables of the per-resource checks keyed by owner, reused from one resource to the next.
	made      *ownerMap[int64, struct{}]    // tokens: acquisitions made, by owner and generation
	maybeMade *ownerMap[struct{}, struct{}] // tokens: owners of acquisitions of unknown outcome
	leases    *ownerMap[token, renewed]     // renewClock: each lease's latest known expiry
	cops      []cop                         // the resource's operations as the direct checks read them
	local     *ownerMap[struct{}, int32]    // modelOps: the search's numbers of the owners
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
// after its call, as otherwise it is concurrent with everything after it. Only the operations
// called within the resource's longest such interval before an involved one are looked at: a
// history with thousands of violations (an unfenced run) is not scanned whole for each.
func (c *checker) excerpt(involved []*Op) ([]int, int) {
	end := func(op *Op) int64 {
		if op.Unknown() {
			return min(op.Return, op.Call+int64(time.Second))
		}
		return op.Return
	}
	if c.byRes == nil {
		c.byRes, c.span = map[string][]*Op{}, map[string]int64{}
		for _, op := range c.h.Ops { // in call order
			c.byRes[op.Resource] = append(c.byRes[op.Resource], op)
			c.span[op.Resource] = max(c.span[op.Resource], end(op)-op.Call)
		}
	}
	in := map[int]bool{}
	for _, op := range involved {
		in[op.Index] = true
	}
	concurrent := map[int]bool{}
	for _, inv := range involved {
		ops := c.byRes[inv.Resource]
		from := sort.Search(len(ops), func(i int) bool { return ops[i].Call >= inv.Call-c.span[inv.Resource] })
		for _, op := range ops[from:] {
			if op.Call > end(inv) {
				break
			}
			if !in[op.Index] && inv.Call <= end(op) {
				concurrent[op.Index] = true
			}
		}
	}
	extra := make([]int, 0, len(concurrent))
	for id := range concurrent {
		extra = append(extra, id)
	}
	sort.Ints(extra)
	more := 0
	if room := maxExcerpt - len(involved); len(extra) > room {
		more = len(extra) - max(room, 0)
		extra = extra[:max(room, 0)]
	}
	out := extra
	for id := range in {
		out = append(out, id)
	}
	sort.Ints(out)
	return out, more
}

// linearizable checks one resource against the model: the linear search, then porcupine
// where the search found no order and no direct check had flagged the resource. When
// porcupine decides that the history is not linearizable, the operation reported is the
// first, by return time, of those outside porcupine's longest partial linearization: it had to take effect before it returned, and no order allowed it.
// It is shown with the last acquisition and publication acknowledged before its call.
func (c *checker) linearizable(res string, ops []*Op, init state, timeout time.Duration, flagged bool) {
	ir := c.res[InvLinearizable]
	for _, op := range ops {
		if op.Index >= 0 { // not the engine's own bumps (selfBumps)
			ir.Checked++
		}
	}
	mops, searched := modelOps(ops, c.local)
	// The linear search first (search.go); porcupine, whose memo is exact but quadratic, only
	// to confirm and explain a history the search found illegal that no direct check flagged.
	steps := searchStepsBase + searchStepsPerOp*len(mops)
	if flagged {
		steps = flaggedStepsBase + flaggedStepsPerOp*len(mops)
	}
	sr := searchModel(mops, []state{init}, time.Now().Add(timeout), steps)
	c.r.SearchSteps += sr.steps
	var why string
	switch sr.verdict {
	case linearizable:
		return
	case timedOut:
		why = fmt.Sprintf("not finished on %s within %s", res, timeout)
	case undecided:
		why = fmt.Sprintf("undecided on %s after %d steps", res, sr.steps)
	}
	if why != "" {
		if flagged {
			ir.Note = addNote(ir.Note, why+", where direct checks had already found violations")
			return
		}
		c.r.Inconclusive = append(c.r.Inconclusive, res)
		ir.Note = addNote(ir.Note, why)
		return
	}
	if flagged {
		// Porcupine's nondeterministic model can take exponential time to prove what the
		// search proved, and the resource already fails: the search's verdict is shown.
		c.searchViolation(res, ops, searched, sr, "porcupine is not run where direct checks already found violations")
		return
	}
	// The search was exhaustive: porcupine gets a short budget, for its exact memo, its
	// culprit and its visualization.
	confirm := min(timeout, flaggedCheckTimeout)
	result, info := porcupine.CheckOperationsVerbose(model(init), toPorcupine(mops, searched), confirm)
	c.r.Linearizations[res] = info
	switch result {
	case porcupine.Ok:
		// Only a collision of the search's 128-bit memo keys can lead here: porcupine found
		// the order the search pruned.
		ir.Note = addNote(ir.Note, "the linear search pruned an order porcupine found on "+res)
		return
	case porcupine.Unknown:
		c.searchViolation(res, ops, searched, sr, fmt.Sprintf("porcupine did not finish within %s", confirm))
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
		if !linearized[op] && !op.Unknown() && op.Index >= 0 && (culprit == nil || op.Return < culprit.Return) {
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

// searchViolation reports the search's illegal verdict on res without porcupine: the
// operation at its deepest point, for the reason given (why).
func (c *checker) searchViolation(res string, ops, searched []*Op, sr searchResult, why string) {
	culprit := ops[0]
	if sr.culprit >= 0 && searched[sr.culprit].Index >= 0 {
		culprit = searched[sr.culprit]
	}
	c.violate(InvLinearizable, res, fmt.Sprintf(
		"no order of the operations explains #%d %s → %s (%d of the %d operations on %s could be ordered before it; "+
			"%s: the linear search's verdict is shown)",
		culprit.Index, culprit.Kind, culprit.Out, sr.depth, len(ops), res, why), culprit)
}

// token is (epoch, generation), compared as the destination compares it.
type token struct{ e, g int64 }

func (a token) less(b token) bool { return a.e < b.e || (a.e == b.e && a.g < b.g) }
func (a token) String() string    { return fmt.Sprintf("epoch %d generation %d", a.e, a.g) }

// tokens checks invariants 1, 2, 3 and 6 on one resource. Tokens are (epoch, generation) in
// lexicographic order: a restore may take generations back, and only the epoch bump that
// follows it keeps every later token above every earlier one, which is what is checked.
func (c *checker) tokens(res string, ops []*Op, cs []cop) {
	var acqs []int32                       // acknowledged acquisitions, by index in ops
	made, maybeMade := c.made, c.maybeMade // acquisitions made; owners of those whose outcome is unknown
	made.clear()
	maybeMade.clear()
	byTok := map[token]int32{}
	for i := range cs {
		o := &cs[i]
		if o.kind != kindAcquire {
			continue
		}
		if o.out == outUnknown {
			maybeMade.put(o.owner, struct{}{}, struct{}{})
		}
		if o.out == outOK {
			acqs = append(acqs, int32(i))
			made.put(o.owner, o.gen, struct{}{})
			c.res[InvUniqueTokens].Checked++
			if prev, ok := byTok[o.tok()]; ok {
				c.violate(InvUniqueTokens, res, fmt.Sprintf("two acquisitions were granted %s", o.tok()), ops[prev], ops[i])
			} else {
				byTok[o.tok()] = int32(i)
			}
		}
	}
	// Sweep in call order, knowing the largest token acknowledged before each call.
	slices.SortStableFunc(acqs, func(a, b int32) int { return cmp.Compare(cs[a].ret, cs[b].ret) })
	top := int32(-1)
	k := 0
	for i := range cs { // in call order
		o := &cs[i]
		for ; k < len(acqs) && cs[acqs[k]].ret < o.call; k++ {
			if top < 0 || cs[top].tok().less(cs[acqs[k]].tok()) {
				top = acqs[k]
			}
		}
		switch {
		case o.kind == kindAcquire && o.out == outOK:
			c.res[InvRealTimeOrder].Checked++
			if top >= 0 && !cs[top].tok().less(o.tok()) {
				c.violate(InvRealTimeOrder, res, fmt.Sprintf(
					"%s was granted to an acquisition that started after %s had been acknowledged",
					o.tok(), cs[top].tok()), ops[top], ops[i])
			}
		case o.write() && o.out == outOK:
			c.res[InvFence].Checked++
			c.res[InvLeaseExists].Checked++
			if top >= 0 && o.tok().less(cs[top].tok()) {
				c.violate(InvFence, res, fmt.Sprintf(
					"%s with %s was accepted after %s had been acknowledged",
					ops[i].Kind, o.tok(), cs[top].tok()), ops[top], ops[i])
			}
			if made.get(o.owner, o.gen) == nil && maybeMade.get(o.owner, struct{}{}) == nil {
				c.violate(InvLeaseExists, res, fmt.Sprintf(
					"%s was accepted for owner %s generation %d, which no acquisition was granted",
					ops[i].Kind, short(ops[i].Owner), o.gen), ops[i])
			}
		}
	}
}

// restoresBetween reports whether a restore of res may have taken effect after from and
// before to: a legitimate rollback, across which published generations and reads may go back.
func (c *checker) restoresBetween(res string, from, to int64) bool {
	for _, r := range c.restores[res] {
		if r.Call < to && r.Return > from {
			return true
		}
	}
	return false
}

// bumps checks invariant 8 on one resource: once a bump of the epoch to E was acknowledged,
// every acquisition called afterwards gets an epoch of at least E, and nothing carrying an
// older epoch is accepted. A restore without a bump takes the epoch back and breaks this.
func (c *checker) bumps(res string, ops []*Op, cs []cop) {
	var bumps []int32 // by index in ops
	for i := range cs {
		if cs[i].kind == kindBump && cs[i].out == outOK {
			bumps = append(bumps, int32(i))
		}
	}
	if len(bumps) == 0 {
		return
	}
	slices.SortStableFunc(bumps, func(a, b int32) int { return cmp.Compare(cs[a].ret, cs[b].ret) })
	top := int32(-1)
	k := 0
	for i := range cs {
		o := &cs[i]
		for ; k < len(bumps) && cs[bumps[k]].ret < o.call; k++ {
			if top < 0 || cs[bumps[k]].epoch > cs[top].epoch {
				top = bumps[k]
			}
		}
		if top < 0 || o.out != outOK || (o.kind != kindAcquire && !o.write()) {
			continue
		}
		c.res[InvBumpFences].Checked++
		if o.epoch < cs[top].epoch {
			what := "accepted"
			if o.kind == kindAcquire {
				what = "granted"
			}
			c.violate(InvBumpFences, res, fmt.Sprintf("%s with %s was %s after the epoch was bumped to %d",
				ops[i].Kind, o.tok(), what, cs[top].epoch), ops[top], ops[i])
		}
	}
}

// renewClockTolerance allows for an engine that reads its clock twice in the renewal's
// statement (PostgreSQL's clock_timestamp() in WHERE and again in SET): the expiry it returns
// can be computed a little after the moment that judged the lease unexpired.
const renewClockTolerance = 10 * time.Millisecond

// renewClock checks invariant 6 with the engine's clock: an accepted renewal returns its new
// expiry, engine-now + ttl, so engine-now at the renewal is that minus the ttl; it must be
// before the lease's expiry as the previous acquisition or renewal of the lease returned it.
// A lease with an earlier renewal of unknown outcome is skipped (its expiry is not known).
func (c *checker) renewClock(res string, ops []*Op, cs []cop) {
	leases := c.leases // by owner and token
	leases.clear()
	for i := range cs { // call order: one process runs one operation of a lease at a time
		o := &cs[i]
		switch {
		case o.kind == kindAcquire && o.out == outOK:
			leases.put(o.owner, o.tok(), renewed{until: o.leaseUntil, by: int32(i)})
		case o.kind == kindRenew:
			l := leases.get(o.owner, o.tok())
			if l == nil {
				continue
			}
			if o.out != outOK {
				l.unknown = l.unknown || o.out == outUnknown
				continue
			}
			if o.leaseUntil == 0 || l.until == 0 || l.unknown {
				l.until, l.by = o.leaseUntil, int32(i)
				continue
			}
			c.res[InvRenewClock].Checked++
			now := o.leaseUntil - o.ttl*1000
			if now >= l.until+renewClockTolerance.Microseconds() {
				c.violate(InvRenewClock, res, fmt.Sprintf(
					"renew of %s was accepted at %s on the database's clock, %s after the lease expired there (%s)",
					o.tok(), usTime(now), time.Duration(now-l.until)*time.Microsecond, usTime(l.until)), ops[l.by], ops[i])
			}
			l.until, l.by = o.leaseUntil, int32(i)
		}
	}
}

// renewed is what renewClock knows of a lease: its expiry as the latest acquisition or
// renewal of it returned it.
type renewed struct {
	until   int64 // µs on the engine's clock; 0: unknown
	by      int32 // the operation that returned it, by index in the resource's operations
	unknown bool
}

func usTime(us int64) string { return time.UnixMicro(us).UTC().Format("15:04:05.000000") }

// clockResolution is how coarse an engine's clock reading may be (SQLite's unixepoch('subsec')
// has milliseconds) plus the two clocks' drift within an era.
const clockResolution = int64(6 * time.Millisecond)

// clockEra is a stretch of the history over which the engine's clock runs at a constant
// offset from the history's: offset (ns, engine minus history) is known to be in [lo, hi].
type clockEra struct {
	from, to int64
	lo, hi   int64
	samples  int
}

// clockMap finds the offset between the engine's clock and the history's in each era: a reply
// that carries engine-now e, from a request called at c and answered at r, shows the offset in
// [e-r, e-c] (widened by clockResolution); the era's offset is the intersection. Eras end at
// clock jumps (operations near one are not used) and every 10 s, so that the rates of the two
// clocks may differ a little (NTP slewing, at most 0.5 ms/s) without mattering.
func (c *checker) clockMap() []clockEra {
	const eraLen = int64(10 * time.Second)
	const margin = int64(500 * time.Millisecond)
	var jumps []int64
	for _, e := range c.h.Events {
		if e.Event == FaultClock || e.Event == FaultRestart {
			jumps = append(jumps, e.Time)
		}
	}
	var eras []clockEra
	from := c.h.Start
	cut := func(to int64) {
		for a := from; a < to; a += eraLen {
			eras = append(eras, clockEra{from: a, to: min(a+eraLen, to), lo: math.MinInt64, hi: math.MaxInt64})
		}
		from = to
	}
	for _, j := range jumps {
		cut(j)
	}
	cut(c.h.End)
	nearJump := func(a, b int64) bool {
		for _, j := range jumps {
			if a < j+margin && b > j-margin {
				return true
			}
		}
		return false
	}
	at := 0 // the era of the previous operation's call
	for _, op := range c.h.Ops {
		if op.Out != OutOK || op.Unknown() {
			continue
		}
		var e int64
		switch {
		case op.Kind == OpShow && op.NowUs != 0:
			e = op.NowUs * 1000
		case (op.Kind == OpAcquire || op.Kind == OpRenew) && op.LeaseUntilUs != 0:
			e = (op.LeaseUntilUs - op.TTLMs*1000) * 1000
		default:
			continue
		}
		if nearJump(op.Call, op.Return) {
			continue
		}
		at = eraOf(eras, at, op.Call)
		i := at
		if i == len(eras) || op.Return > eras[i].to {
			continue // straddles two eras
		}
		eras[i].lo, eras[i].hi = max(eras[i].lo, e-op.Return-clockResolution), min(eras[i].hi, e-op.Call+clockResolution)
		eras[i].samples++
	}
	return eras
}

// eraOf is the index of the era that a call at call falls in (the first era to end after it),
// len(eras) when none, given from, the era of an earlier call: the history's operations are
// in call order, so the eras are found in one pass over them rather than by a binary search
// per operation, whose cost grew with the history's length (issue 13). A call before the
// earlier one is searched for.
func eraOf(eras []clockEra, from int, call int64) int {
	if from > 0 && eras[from-1].to > call {
		return sort.Search(len(eras), func(i int) bool { return eras[i].to > call })
	}
	for from < len(eras) && eras[from].to <= call {
		from++
	}
	return from
}

// liveness checks invariant 14 where the history can: an acquisition answered busy names the
// holder's expiry on the engine's clock; if the engine's clock had passed it by more than
// LivenessBound when the request was called (the earliest moment the engine could decide),
// the resource was free and the answer was wrong.
func (c *checker) liveness() {
	eras := c.clockMap()
	inconsistent, at := 0, 0
	for _, op := range c.h.Ops {
		if op.Kind != OpAcquire || op.Out != OutBusy || op.LeaseUntilUs == 0 {
			continue
		}
		at = eraOf(eras, at, op.Call)
		i := at
		if i == len(eras) || op.Return > eras[i].to || eras[i].samples == 0 {
			continue
		}
		era := eras[i]
		if era.lo > era.hi {
			inconsistent++
			continue
		}
		c.res[InvLiveness].Checked++
		earliest := op.Call + era.lo // engine time, ns
		until := op.LeaseUntilUs * 1000
		if earliest > until+int64(LivenessBound) {
			c.violate(InvLiveness, op.Resource, fmt.Sprintf(
				"acquire was answered busy by a lease that expired at %s on the database's clock, at least %s before the request reached it (bound %s)",
				usTime(op.LeaseUntilUs), time.Duration(earliest-until).Round(time.Millisecond), LivenessBound), op)
		}
	}
	if inconsistent > 0 {
		c.res[InvLiveness].Note = addNote(c.res[InvLiveness].Note, fmt.Sprintf(
			"%d busy answers not checked: the clock samples of their stretch disagree", inconsistent))
	}
}

// publications checks invariant 4 on one resource: one accepted publication per token, and a
// published generation that never decreases in real time, as seen by publications and reads,
// except across a restore (a legitimate rollback: facts from before it are set aside).
func (c *checker) publications(res string, ops []*Op, cs []cop) {
	byTok := map[token]int32{}
	type known struct {
		at  int64
		pub int64
		op  int32 // by index in ops
	}
	var facts []known // "the published generation was at least pub at time at"
	for i := range cs {
		o := &cs[i]
		switch {
		case (o.kind == kindPublish || o.kind == kindPublishRelease) && o.out == outOK:
			c.res[InvOnePublication].Checked++
			if prev, ok := byTok[o.tok()]; ok {
				c.violate(InvOnePublication, res, fmt.Sprintf("%s published twice", o.tok()), ops[prev], ops[i])
			} else {
				byTok[o.tok()] = int32(i)
			}
			facts = append(facts, known{o.ret, o.gen, int32(i)})
		case o.read() && o.out == outOK:
			facts = append(facts, known{o.ret, o.readPub, int32(i)})
		}
	}
	slices.SortStableFunc(facts, func(a, b known) int { return cmp.Compare(a.at, b.at) })
	var top *known
	k := 0
	var cut int64 = math.MinInt64 // facts up to here are from before a restore, which may roll them back
	for i := range cs {
		o := &cs[i]
		for _, r := range c.restores[res] {
			if r.Call < o.call && r.Return > cut {
				cut, top = r.Return, nil
				for j := range facts[:k] {
					if facts[j].at > cut && (top == nil || facts[j].pub > top.pub) {
						top = &facts[j]
					}
				}
			}
		}
		for ; k < len(facts) && facts[k].at < o.call; k++ {
			if facts[k].at > cut && (top == nil || facts[k].pub > top.pub) {
				top = &facts[k]
			}
		}
		if o.out != outOK || top == nil {
			continue
		}
		switch {
		case o.kind == kindPublish || o.kind == kindPublishRelease:
			c.res[InvPublishedGrows].Checked++
			if o.gen <= top.pub {
				c.violate(InvPublishedGrows, res, fmt.Sprintf(
					"a publication of generation %d was accepted after the published generation was %d",
					o.gen, top.pub), ops[top.op], ops[i])
			}
		case o.read():
			c.res[InvPublishedGrows].Checked++
			if o.readPub < top.pub {
				c.violate(InvPublishedGrows, res, fmt.Sprintf(
					"a read returned published generation %d after it had been %d", o.readPub, top.pub), ops[top.op], ops[i])
			}
		}
	}
}

// payloads checks invariant 5: what a read returns was published, by that generation.
func (c *checker) payloads(res string, ops []*Op, cs []cop) {
	// The payloads published per generation (a few at most: one generation's holder publishes
	// them), keyed by the number, so that only a get's payload is compared, never hashed: the
	// payloads' bytes, scattered over a large history, missed the cache at every hash.
	published := map[int64][]string{}
	for i := range cs {
		if o := &cs[i]; (o.kind == kindPublish || o.kind == kindPublishRelease) && (o.out == outOK || o.out == outUnknown) {
			published[o.gen] = append(published[o.gen], ops[i].Payload)
		}
	}
	hasSize := func(gen, size int64) bool {
		for _, p := range published[gen] {
			if int64(len(p)) == size {
				return true
			}
		}
		return false
	}
	for i := range cs { // only the reads' *Op are read
		if o := &cs[i]; o.out != outOK || o.readPub == 0 || !o.read() {
			continue
		}
		switch op := ops[i]; op.Kind {
		case OpGet:
			c.res[InvPayloadBelongs].Checked++
			if !slices.Contains(published[op.ReadPub], op.Payload) {
				c.violate(InvPayloadBelongs, res, fmt.Sprintf(
					"get returned payload %s as generation %d, which no publication of that generation carried",
					op.Payload, op.ReadPub), op)
			}
		case OpShow:
			c.res[InvPayloadBelongs].Checked++
			if !hasSize(op.ReadPub, op.PayloadBytes) {
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
		if prev := last[k]; prev != nil && !c.restoresBetween(op.Resource, prev.Call, op.Call) {
			if op.ReadPub < prev.ReadPub || (op.Kind == OpShow && prev.Kind == OpShow && op.ReadGen < prev.ReadGen) {
				c.violate(InvReadsMonotonic, op.Resource, fmt.Sprintf("%s read an older state than it had read before", op.Proc), prev, op)
			}
		}
		last[k] = op
	}
}

// identities checks invariant 12: every acquisition used a fresh owner identity.
func (c *checker) identities() {
	seen := make([]*Op, len(c.h.Owners)) // by owner number: no string hashed
	for _, op := range c.h.Ops {
		if op.Kind != OpAcquire {
			continue
		}
		c.res[InvIdentityPerAcq].Checked++
		if prev := seen[op.OwnerN]; prev != nil {
			c.violate(InvIdentityPerAcq, op.Resource, fmt.Sprintf("owner %s was used by two acquisitions", short(op.Owner)), prev, op)
		}
		seen[op.OwnerN] = op
	}
}

func addNote(note, s string) string {
	if note == "" {
		return s
	}
	return note + "; " + s
}
