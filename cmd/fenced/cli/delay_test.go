package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTortureDelay runs the delay fault (a proxy of the run's own between the workers and the
// server: latency with jitter, stalls longer than a TTL, resets) on each networked backend:
// no violation, at least one delay injected, the proxy's events in the report.
func TestTortureDelay(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		db   func(t *testing.T) string
	}{
		{"postgres", postgresSchema},
		{"mariadb", mysqlDatabase},
		{"redis", redisPrefix},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			report := t.TempDir()
			code, out := runTortureIn(t, report, b.db(t), "--duration", "12s", "--faults", "delay,drop-reply", "--allow-nondurable")
			if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
				t.Fatalf("torture with delays: exit %d, want 0 and no violations", code)
			}
			if !strings.Contains(out, "the workers reach the database through a proxy on 127.0.0.1:") {
				t.Error("the run did not say where its proxy listens")
			}
			checkTortured(t, out, "delay")
			page, err := os.ReadFile(filepath.Join(report, "index.html"))
			if err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(`delay nemesis (latency: every byte|stall: \d+ of \d+ connections|reset: \d+ of \d+ connections)`).Match(page) {
				t.Error("the report's events show no delay")
			}
		})
	}
}
