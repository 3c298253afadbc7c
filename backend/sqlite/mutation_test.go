package sqlite

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/driver"
)

// The conformance suite must be able to fail. These tests run it, in a child process, against
// SQLite drivers with a deliberately broken Publish, and require the handover test to catch each.

// brokenPublish is how a mutated driver publishes.
var brokenPublish = map[string]string{
	// A naive lease: lock, then an unconditional write.
	"unconditional": `UPDATE fenced_resources SET payload = ?5, published_generation = ?3 WHERE resource = ?1`,
	// The high-water mark alone: refuses old generations only after a newer one has published.
	"high-water-mark": `UPDATE fenced_resources SET payload = ?5, published_generation = ?3
		WHERE resource = ?1 AND published_generation < ?3`,
}

type mutant struct {
	*Driver
	publish string
}

func (m mutant) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return execOne(ctx, m.db, m.publish, l.Resource, l.Owner, l.Generation, l.Epoch, p.Payload)
}

// mutate wraps d when the test binary runs as the child of TestSuiteCatchesBrokenPublish.
func mutate(d *Driver) driver.Driver {
	if q, ok := brokenPublish[os.Getenv("FENCED_MUTANT")]; ok {
		return mutant{d, q}
	}
	return d
}

func TestSuiteCatchesBrokenPublish(t *testing.T) {
	if os.Getenv("FENCED_MUTANT") != "" {
		t.Skip("running as a mutant child")
	}
	for name := range brokenPublish {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run", "^TestConformance$/^Handover$", "-test.count=1")
			cmd.Env = append(os.Environ(), "FENCED_MUTANT="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the handover test passed against a driver whose publish is %s:\n%s", name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestConformance/Handover") ||
				!strings.Contains(string(out), "want a refusal") {
				t.Fatalf("the child failed, but not in the handover check:\n%s", out)
			}
		})
	}
}
