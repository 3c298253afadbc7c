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

// epochFromOne is the rule before epochs came from the clock: a new store starts at epoch 1
// and a bump adds one.
type epochFromOne struct{ *Driver }

func (m epochFromOne) Migrate(ctx context.Context) error {
	if err := m.Driver.Migrate(ctx); err != nil {
		return err
	}
	_, err := m.db.ExecContext(ctx, `UPDATE fenced_meta SET epoch = 1 WHERE epoch > 1000000`)
	return err
}

func (m epochFromOne) BumpEpoch(ctx context.Context) (int64, error) {
	var epoch int64
	err := m.db.QueryRowContext(ctx, `UPDATE fenced_meta SET epoch = epoch + 1 RETURNING epoch`).Scan(&epoch)
	return epoch, err
}

// mutate wraps d when the test binary runs as the child of a TestSuiteCatches test.
func mutate(d *Driver) driver.Driver {
	if q, ok := brokenPublish[os.Getenv("FENCED_MUTANT")]; ok {
		return mutant{d, q}
	}
	if os.Getenv("FENCED_MUTANT") == "epoch-from-one" {
		return epochFromOne{d}
	}
	return d
}

// TestSuiteCatchesEpochFromOne: with epochs that start at 1 and count bumps, a store lost and
// created again issues a token it issued before; both total-loss tests must say so.
func TestSuiteCatchesEpochFromOne(t *testing.T) {
	if os.Getenv("FENCED_MUTANT") != "" {
		t.Skip("running as a mutant child")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestConformance$/^TotalLoss", "-test.count=1")
	cmd.Env = append(os.Environ(), "FENCED_MUTANT=epoch-from-one")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the total-loss tests passed against epochs that start at 1:\n%s", out)
	}
	for _, name := range []string{"TotalLossNeverReissuesAToken", "TotalLossAfterABump"} {
		if !strings.Contains(string(out), "--- FAIL: TestConformance/"+name) {
			t.Errorf("%s did not fail against epochs that start at 1:\n%s", name, out)
		}
	}
	if !strings.Contains(string(out), "not greater than") {
		t.Fatalf("the child failed, but not in the token comparison:\n%s", out)
	}
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
