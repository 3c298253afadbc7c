package gate_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination/destinationtest"
	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/destination/gate/gatetest"
)

// The destination suite must be able to fail. TestSuiteCatchesMutants runs it, in a child
// process, against gates broken on purpose, and requires the takeover schedule to catch each
// by the stale write it accepted.

const mutantEnv = "FENCED_GATE_MUTANT"

// noFence is a holder that never fences on acquisition: a high-water mark alone.
type noFence struct{}

func (noFence) Fence(context.Context, string, fenced.Token) error { return nil }

func TestMutantSuite(t *testing.T) {
	m := os.Getenv(mutantEnv)
	if m == "" {
		t.Skip("run by TestSuiteCatchesMutants with " + mutantEnv + " set")
	}
	destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
		if m == "unconditional-exec" { // the same, in Exec's single statement on PostgreSQL
			s := gatetest.NewService(t, gatetest.Engine{Dialect: gate.Postgres, Open: openPostgres})
			gate.Unconditional(s.Gate)
			h := s.Harness()
			h.Write = s.WriteExec
			return h
		}
		s := gatetest.NewService(t, gatetest.Engine{Dialect: gate.SQLite, Open: openSQLite})
		h := s.Harness()
		switch m {
		case "unconditional": // raise the mark without comparing
			gate.Unconditional(s.Gate)
		case "no-fence":
			h.Fencer = noFence{}
		default:
			t.Fatalf("unknown mutant %q", m)
		}
		return h
	})
}

func TestSuiteCatchesMutants(t *testing.T) {
	for _, m := range []string{"unconditional", "unconditional-exec", "no-fence"} {
		t.Run(m, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestMutantSuite$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+m)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed the %s mutant:\n%s", m, out)
			}
			if want := "A's write after B fenced: got <nil>"; !strings.Contains(string(out), want) {
				t.Fatalf("the takeover schedule did not catch the %s mutant:\n%s", m, out)
			}
		})
	}
}
