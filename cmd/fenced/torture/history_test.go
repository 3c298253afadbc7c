package torture

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBuildPairsAsAMapWould holds Build to the plain way of pairing calls with returns, a map
// keyed by (process, number), on records in any order: Build finds a call through a slice per
// process instead, with a map for numbers far from 1, 2, 3..., so that the pairing costs the
// same per record at a million operations (issue 13). The records mix both kinds of numbers
// (negative, zero, huge, repeated), processes and owners with spaces and non-ASCII, calls made
// twice (the later record wins), returns and notes for calls never made, and records shuffled
// (the files of several processes, concatenated, are not in call order).
func TestBuildPairsAsAMapWould(t *testing.T) {
	for seed := range uint64(200) {
		recs := randomRecords(rand.New(rand.NewPCG(seed, 7)))
		got, want := Build(recs, 0), mapPairing(recs)
		if len(got.Ops) != len(want) {
			t.Fatalf("seed %d: %d operations, want %d", seed, len(got.Ops), len(want))
		}
		for i, op := range got.Ops {
			w := want[i]
			if op.Index != i || op.Proc != w.Proc || op.ID != w.ID || op.Call != w.Call || op.Return != w.Return ||
				op.Out != w.Out || op.Owner != w.Owner || op.ReadOwner != w.ReadOwner || op.ReadGen != w.ReadGen ||
				op.Note != w.Note || op.Payload != w.Payload || got.Owners[op.OwnerN] != op.Owner ||
				got.Owners[op.ReadOwnerN] != op.ReadOwner || got.Resources()[op.ResN] != op.Resource {
				t.Fatalf("seed %d, operation %d:\n got %+v\nwant %+v", seed, i, *op, w)
			}
		}
		if owners := slices.Compact(slices.Sorted(slices.Values(got.Owners))); len(owners) != len(got.Owners) {
			t.Fatalf("seed %d: an owner numbered twice: %q", seed, got.Owners)
		}
	}
}

// randomRecords is a short history of calls, returns and notes, in a random order.
func randomRecords(rng *rand.Rand) []Record {
	procs := []string{"w 0", "wé 1", "nemesis", "w\x002"}
	ids := []int64{1, 2, 3, 4, 5, 6, 0, -3, 1 << 40, 70, 200}
	var recs []Record
	for range 40 {
		p, id := procs[rng.IntN(len(procs))], ids[rng.IntN(len(ids))]
		if rng.IntN(3) > 0 { // mostly the dense pattern
			id = int64(1 + rng.IntN(8))
		}
		t := rng.Int64N(1000)
		owner := fmt.Sprintf("owner ü %d", rng.IntN(6))
		switch rng.IntN(4) {
		case 0, 1:
			recs = append(recs, Record{Kind: KindCall, Proc: p, ID: id, Time: t, Op: OpShow, Resource: fmt.Sprintf("rés %d", rng.IntN(3)),
				Owner: owner, Payload: "a\x00b"})
		case 2:
			recs = append(recs, Record{Kind: KindReturn, Proc: p, ID: id, Time: t + 1000, Out: OutOK, Gen: rng.Int64N(9), ReadOwner: owner})
		default:
			recs = append(recs, Record{Kind: KindNote, Proc: p, ID: id, Time: t, Detail: fmt.Sprint("note ", rng.IntN(9))})
		}
	}
	return recs
}

// mapPairing is Build's pairing as it was written before issue 13: a map of every call by
// (process, number), filled in the records' order, and the operations sorted stably by call.
func mapPairing(recs []Record) []Op {
	type key struct {
		proc string
		id   int64
	}
	calls := map[key]*Op{}
	var ops []*Op
	end := int64(0)
	for _, r := range recs {
		end = max(end, r.Time+1)
		if r.Kind == KindCall {
			op := &Op{Proc: r.Proc, ID: r.ID, Kind: r.Op, Resource: r.Resource, Owner: r.Owner, Payload: r.Payload, Call: r.Time, Out: OutUnknown}
			calls[key{r.Proc, r.ID}] = op
			ops = append(ops, op)
		}
	}
	for _, r := range recs {
		op := calls[key{r.Proc, r.ID}]
		switch {
		case op == nil:
		case r.Kind == KindReturn:
			op.Return, op.Out, op.ReadGen, op.ReadOwner = r.Time, r.Out, r.Gen, r.ReadOwner
		case r.Kind == KindNote:
			op.Note = r.Detail
		}
	}
	slices.SortStableFunc(ops, func(a, b *Op) int { return int(a.Call - b.Call) })
	out := make([]Op, len(ops))
	for i, op := range ops {
		if op.Unknown() && (op.Note == "" || op.Return == 0) {
			op.Return = end
		}
		op.Index = i
		out[i] = *op
	}
	return out
}

// TestInitialStatesRoundTrip: the initial states written beside a run's histories are read
// back as they were, and a directory without them (a run older than the file) reads as none.
func TestInitialStatesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if init, err := ReadInitial(dir); err != nil || init != nil {
		t.Fatalf("no file: %v, %v; want none", init, err)
	}
	want := map[string]State{
		"r1": {Epoch: 1796528408804274, Generation: 7, Owner: "o ü", PublishedGeneration: 6, Payload: "p\x00"},
		"r2": {},
	}
	if err := WriteInitial(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadInitial(dir)
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("read %v, %v; want %v", got, err, want)
	}
}
