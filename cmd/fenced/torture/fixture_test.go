package torture

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// fixtureOp is one line of a search fixture in testdata/: an operation as porcupineOps makes
// it, its times in nanoseconds.
type fixtureOp struct {
	Client int    `json:"client"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
	In     input  `json:"in"`
	Out    output `json:"out"`
}

// loadFixture reads a search fixture from testdata/.
func loadFixture(t *testing.T, name string) []porcupine.Operation {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ops []porcupine.Operation
	dec := json.NewDecoder(f)
	for {
		var o fixtureOp
		if err := dec.Decode(&o); err == io.EOF {
			return ops
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ops = append(ops, porcupine.Operation{ClientId: o.Client, Call: o.Call, Return: o.Return, Input: o.In, Output: o.Out})
	}
}

// TestRedisUnknownBurstChecks is a window of 79 operations of the one Redis resource a 60 s
// torture run (seed 43, restarts and dropped replies) left inconclusive: 29 acquisitions
// without a reply, open until the end, overlap a restart whose own bump must be ordered after
// an unanswered publication and release (a read shows its generation published). The search
// backtracked over every subset of those acquisitions before each choice and timed out; with
// twins ordered by their calls (search.go) it decides in milliseconds, both the history as it
// was and a copy with the read broken (a generation no order explains), which needs the
// whole search. Mutant: ordering twins freely (no prevTwin check) times out on both.
func TestRedisUnknownBurstChecks(t *testing.T) {
	ops := loadFixture(t, "redis-unknown-burst.jsonl")
	init := []state{{Gen: 34, Pub: 34}}
	broken := slices.Clone(ops)
	read := -1
	for i, op := range broken {
		if in, out := op.Input.(input), op.Output.(output); in.Kind == OpShow && out.Out == OutOK && out.Gen == 41 {
			out.Gen = 42 // the owner acquired generation 41, read at 42
			broken[i].Output, read = out, i
		}
	}
	if read < 0 {
		t.Fatal("the fixture has no read of generation 41")
	}
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want verdict
	}{{"as recorded", ops, linearizable}, {"a read broken", broken, illegal}} {
		start := time.Now()
		r := search(c.ops, init, start.Add(30*time.Second))
		t.Logf("%s: verdict %d in %s, depth %d", c.name, r.verdict, time.Since(start), r.depth)
		if r.verdict != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, r.verdict, c.want)
		}
		if c.want == illegal && r.culprit != read {
			t.Errorf("%s: culprit %d, want the broken read %d", c.name, r.culprit, read)
		}
	}
}
