package torture

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// synthetic writes a history of n operations of a correct store, simulated here: procs
// processes on resources resources, one operation's effect every 100 µs (its call up to 40 µs
// before, its return up to 40 µs after, so that operations overlap in time but not within a
// process), leases of 5-20 ms on an engine clock that is the simulation's, and one operation
// in lossEvery (none when 0) left without a reply (its effect applied or not, at random); an
// epoch bump halfway. It is the input of the checker's scaling measurement.
func synthetic(n, procs, resources, lossEvery int, seed uint64) []Record {
	return simulate(n, procs, resources, lossEvery, seed, false)
}

// simulate is synthetic, and with restore a copy of every row taken a quarter of the way and
// restored just before the bump halfway: the generations go back to the copy's.
func simulate(n, procs, resources, lossEvery int, seed uint64, restore bool) []Record {
	rng := rand.New(rand.NewPCG(seed, 1))
	type row struct {
		gen, until, pub int64
		owner, payload  string
	}
	type lease struct {
		res        string
		owner      string
		gen, ttlMs int64
	}
	const clock = int64(1_700_000_000_000_000) // the engine's clock at the history's start, µs
	epoch := clock
	rows := map[string]*row{}
	names := make([]string, resources)
	for i := range names {
		names[i] = fmt.Sprintf("res %d ü", i)
		rows[names[i]] = &row{}
	}
	held := make([]*lease, procs)
	ids := make([]int64, procs)
	owners := 0
	recs := make([]Record, 0, 2*n)
	var nemID int64
	copies := map[string]row{}
	for i := range n {
		at := int64(i)*100_000 - 50_000 // between two operations' effects
		if restore && i == n/4 {
			for _, res := range names {
				nemID++
				w := rows[res]
				copies[res] = *w
				recs = append(recs, Record{Kind: KindCall, Proc: "nemesis", ID: nemID, Time: at - 5_000, Op: OpSnapshot, Resource: res},
					Record{Kind: KindReturn, Proc: "nemesis", ID: nemID, Time: at + 5_000, Out: OutOK, StoreEpoch: epoch,
						Gen: w.gen, ReadOwner: w.owner, ReadPub: w.pub, Payload: w.payload})
			}
		}
		if restore && i == n/2 {
			for _, res := range names {
				nemID++
				c := copies[res]
				*rows[res] = c
				recs = append(recs, Record{Kind: KindCall, Proc: "nemesis", ID: nemID, Time: at - 20_000, Op: OpRestore, Resource: res,
					StoreEpoch: epoch, Gen: c.gen, Owner: c.owner, ReadPub: c.pub, Payload: c.payload},
					Record{Kind: KindReturn, Proc: "nemesis", ID: nemID, Time: at - 10_000, Out: OutOK})
			}
		}
		if i == n/2 { // an epoch bump, on every resource
			epoch += 1_000_000
			for _, res := range names {
				nemID++
				rows[res].owner = ""
				recs = append(recs, Record{Kind: KindCall, Proc: "nemesis", ID: nemID, Time: at - 5_000, Op: OpBump, Resource: res},
					Record{Kind: KindReturn, Proc: "nemesis", ID: nemID, Time: at + 5_000, Out: OutOK, Epoch: epoch})
			}
		}
		p := i % procs
		proc := fmt.Sprintf("w%d", p)
		point := int64(i) * 100_000 // ns
		call := point - rng.Int64N(40_000)
		ret := point + rng.Int64N(40_000)
		nowUs := clock + point/1000
		ids[p]++
		c := Record{Kind: KindCall, Proc: proc, ID: ids[p], Time: call}
		r := Record{Kind: KindReturn, Proc: proc, ID: ids[p], Time: ret, Out: OutOK}
		unknown := lossEvery > 0 && rng.IntN(lossEvery) == 0
		apply := !unknown || rng.IntN(2) == 0
		l := held[p]
		switch {
		case l == nil && rng.IntN(5) == 0: // a read
			res := names[rng.IntN(resources)]
			w := rows[res]
			c.Resource = res
			if rng.IntN(2) == 0 {
				c.Op = OpShow
				r.Gen, r.ReadOwner, r.ReadPub, r.PayloadBytes, r.NowUs, r.StoreEpoch = w.gen, w.owner, w.pub, int64(len(w.payload)), nowUs, epoch
				if w.owner != "" {
					r.LeaseUntilUs = w.until
				}
			} else {
				c.Op = OpGet
				r.ReadPub, r.Payload = w.pub, w.payload
				if w.pub == 0 {
					r.Out = OutNotFound
				}
			}
		case l == nil: // acquire
			res := names[rng.IntN(resources)]
			w := rows[res]
			owners++
			owner := fmt.Sprintf("o%d", owners)
			ttl := 5 + rng.Int64N(16)
			c.Op, c.Resource, c.Owner, c.TTLMs = OpAcquire, res, owner, ttl
			if w.owner != "" && w.until > nowUs {
				r.Out, r.Gen, r.LeaseUntilUs = OutBusy, w.gen, w.until
				break
			}
			if apply {
				w.gen, w.owner, w.until = w.gen+1, owner, nowUs+ttl*1000
				r.Epoch, r.Gen, r.LeaseUntilUs = epoch, w.gen, w.until
				if !unknown {
					held[p] = &lease{res: res, owner: owner, gen: w.gen, ttlMs: ttl}
				}
			}
		default: // renew, publish, publish and release, or release the lease held
			w := rows[l.res]
			c.Resource, c.Owner, c.Epoch, c.Gen = l.res, l.owner, epoch, l.gen
			current := w.owner == l.owner && w.gen == l.gen
			live := current && w.until > nowUs
			switch x := rng.IntN(10); {
			case x < 2:
				c.Op, c.TTLMs = OpRenew, l.ttlMs
				if !live {
					r.Out = OutRefused
				} else if apply {
					w.until = nowUs + l.ttlMs*1000
					r.LeaseUntilUs = w.until
				}
			case x < 7:
				c.Op, c.Payload = OpPublish, fmt.Sprintf("%s/%d", l.owner, l.gen)
				if x >= 5 {
					c.Op = OpPublishRelease
				}
				if !live || l.gen <= w.pub {
					r.Out = OutRefused
				} else if apply {
					w.pub, w.payload = l.gen, c.Payload
					if c.Op == OpPublishRelease {
						w.owner = ""
					}
				}
				if c.Op == OpPublishRelease {
					held[p] = nil
				}
			default:
				c.Op = OpRelease
				held[p] = nil
				if !current {
					r.Out = OutRefused
				} else if apply {
					w.owner = ""
				}
			}
		}
		recs = append(recs, c)
		if !unknown {
			recs = append(recs, r)
		}
	}
	return recs
}

// TestSyntheticHistoryChecks runs the checker on a simulated correct store: the generator and
// the checker agree, so the scaling measurement below measures a passing check.
func TestSyntheticHistoryChecks(t *testing.T) {
	r := Check(Build(synthetic(10_000, 16, 8, 200, 1), 0), nil, time.Minute)
	for _, v := range r.Violations {
		t.Errorf("%s: %s", v.Invariant, v.Message)
	}
	if len(r.Inconclusive) > 0 || r.Ops != 10_000+8 {
		t.Errorf("ops %d, inconclusive %v", r.Ops, r.Inconclusive)
	}
	for _, inv := range r.Invariants {
		if inv.Checked == 0 && inv.Name != InvNoRevival && inv.Name != InvGate { // no rowlock fault, no gate here
			t.Errorf("%s: nothing checked", inv.Name)
		}
	}
}

// TestCheckerScale measures the checker on synthetic histories of growing size; it runs only
// when FENCED_TORTURE_SCALE names the largest size (make torture sets 1000000).
// FENCED_TORTURE_SCALE_REPEAT=N builds and checks each history N times and reports the least
// CPU time of each: on a machine shared with other work, the least of several is the steadiest
// estimate of what the work itself costs (another process's load only ever adds to it), and a
// first Build in a fresh heap also pays for the heap's growth.
func TestCheckerScale(t *testing.T) {
	limit, _ := strconv.Atoi(os.Getenv("FENCED_TORTURE_SCALE"))
	if limit == 0 {
		t.Skip("set FENCED_TORTURE_SCALE=1000000 to measure the checker on 10k..1M operations")
	}
	repeat, _ := strconv.Atoi(os.Getenv("FENCED_TORTURE_SCALE_REPEAT"))
	repeat = max(repeat, 1)
	// Two series: a fixed number of resources (the operations per porcupine partition grow
	// with the history), and a fixed number of operations per resource (the partitions' count
	// grows instead).
	for _, perResource := range []bool{false, true} {
		var prev, prevBuild time.Duration
		for n := 10_000; n <= limit; n *= 10 {
			resources := 8
			if perResource {
				resources = n / 1250
			}
			recs := synthetic(n, 16, resources, 200, 1)
			var (
				h     *History
				build time.Duration
			)
			for i := range repeat { // Build leaves recs as they were: each build starts alike
				h = nil //nolint:ineffassign // the previous build is freed before this one is timed
				runtime.GC()
				cpu0 := cpuTime()
				h = Build(recs, 0)
				if c := cpuTime() - cpu0; i == 0 || c < build {
					build = c
				}
			}
			var (
				r      *Result
				d, cpu time.Duration
			)
			for i := range repeat {
				runtime.GC()
				cpu0 := cpuTime()
				start := time.Now()
				r = Check(h, nil, 10*time.Minute)
				if c := cpuTime() - cpu0; i == 0 || c < cpu {
					d, cpu = time.Since(start), c
				}
			}
			growth, buildGrowth := "", ""
			if prev > 0 {
				growth = fmt.Sprintf(", CPU ×%.1f for ×10 operations", float64(cpu)/float64(prev))
				buildGrowth = fmt.Sprintf(" (×%.1f)", float64(build)/float64(prevBuild))
			}
			fmt.Printf("checker: %7d operations (%d unknown), %3d resources: %s wall, %s CPU (%.2f µs/op), %d violations%s; Build %s CPU%s\n",
				r.Ops, r.Unknown, resources, d.Round(time.Millisecond), cpu.Round(time.Millisecond),
				float64(cpu.Nanoseconds())/1000/float64(r.Ops), len(r.Violations), growth, build.Round(time.Millisecond), buildGrowth)
			if !r.OK() || len(r.Inconclusive) > 0 {
				t.Errorf("%d operations: %d violations, inconclusive %v", n, len(r.Violations), r.Inconclusive)
			}
			prev, prevBuild = cpu, build
		}
	}
}

// TestCheckerSteps runs one step of the checker on one synthetic history, for counting its
// instructions under valgrind, which, unlike time on a shared machine, do not move with the
// load. It runs only when FENCED_TORTURE_STEPS names the number of operations;
// FENCED_TORTURE_STEP says how far to go: gen (make the records), build (and Build them) or
// check (and Check them). A step's count is its run's less the previous step's; see
// docs/TORTURE.md ("counted instructions") for the command.
func TestCheckerSteps(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FENCED_TORTURE_STEPS"))
	if n == 0 {
		t.Skip("set FENCED_TORTURE_STEPS=N and FENCED_TORTURE_STEP=gen|build|check to run one step under valgrind")
	}
	step := os.Getenv("FENCED_TORTURE_STEP")
	if step != "gen" && step != "build" && step != "check" {
		t.Fatalf("FENCED_TORTURE_STEP=%q: want gen, build or check", step)
	}
	recs := synthetic(n, 16, 8, 200, 1)
	if step == "gen" {
		return
	}
	h := Build(recs, 0)
	if step == "build" {
		return
	}
	if r := Check(h, nil, 10*time.Minute); !r.OK() || len(r.Inconclusive) > 0 {
		t.Fatalf("%d operations: %d violations, inconclusive %v", n, len(r.Violations), r.Inconclusive)
	}
}

// cpuTime is the CPU time this process has used (user and system, the garbage collector's
// included): steadier than the wall clock on a loaded machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestRecheckKept checks again a report directory a torture run left (make torture's with
// FENCED_TORTURE_KEEP, or any run's --report): FENCED_TORTURE_RECHECK names it. It prints the
// verdict and the check's time, the least of FENCED_TORTURE_RECHECK_REPEAT runs (default 1),
// so that the checker can be measured and profiled on a real history (-cpuprofile) without
// running the workers again.
func TestRecheckKept(t *testing.T) {
	dir := os.Getenv("FENCED_TORTURE_RECHECK")
	if dir == "" {
		t.Skip("set FENCED_TORTURE_RECHECK=DIR, a torture run's report directory")
	}
	repeat, _ := strconv.Atoi(os.Getenv("FENCED_TORTURE_RECHECK_REPEAT"))
	h, err := Load(filepath.Join(dir, "history"))
	if err != nil {
		t.Fatal(err)
	}
	init, err := ReadInitial(dir)
	if err != nil {
		t.Fatal(err)
	}
	var (
		r      *Result
		d, cpu time.Duration
	)
	for i := range max(repeat, 1) {
		runtime.GC()
		cpu0 := cpuTime()
		start := time.Now()
		r = Check(h, init, 0)
		if c := cpuTime() - cpu0; i == 0 || c < cpu {
			d, cpu = time.Since(start), c
		}
	}
	fmt.Printf("recheck: %d operations (%d unknown), %d resources: %s wall, %s CPU, %d search steps, %d violations, inconclusive %v\n",
		r.Ops, r.Unknown, len(h.Resources()), d.Round(time.Millisecond), cpu.Round(time.Millisecond),
		r.SearchSteps, len(r.Violations), r.Inconclusive)
	for _, ir := range r.Invariants {
		if ir.Violations > 0 || ir.Note != "" {
			fmt.Printf("  %s: %d checked, %d violations %s\n", ir.Name, ir.Checked, ir.Violations, ir.Note)
		}
	}
	if os.Getenv("FENCED_TORTURE_RECHECK_RESOURCES") == "" {
		return
	}
	// Each resource's model search alone, as Check runs it (the engine's own bumps added),
	// for where the search's time goes.
	byRes := make([][]*Op, len(h.Resources()))
	for _, op := range h.Ops {
		if !op.Gate() {
			byRes[op.ResN] = append(byRes[op.ResN], op)
		}
	}
	bumps := selfBumps(h)
	local := newOwnerMap[struct{}, int32](len(h.Owners))
	for n, res := range h.Resources() {
		mops, _ := modelOps(withSelfBumps(byRes[n], bumps, res), local)
		restores, unknown := 0, 0
		for _, m := range mops {
			if m.in.Kind == OpRestore {
				restores++
			}
			if m.out.Out == OutUnknown {
				unknown++
			}
		}
		start := time.Now()
		sr := searchModel(mops, []state{init[res].model()}, start.Add(time.Minute), 0)
		fmt.Printf("  %s: %d searched (%d unknown, %d restores): %s, verdict %d, %d steps, memo %d, pruned %d\n",
			res, len(mops), unknown, restores, time.Since(start).Round(time.Millisecond), sr.verdict, sr.steps, sr.memo, sr.pruned)
	}
}
