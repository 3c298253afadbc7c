package cli_test

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTortureArtifacts: with --artifacts every result is published as an artifact and every
// read follows its pointer; the checker's payload rule then holds each read to the bytes the
// winning publisher uploaded. A fenced run finds nothing; two planted bugs in the workers'
// artifact path (publishing another attempt's pointer, overwriting another attempt's object)
// are caught as reads no publication explains. Short runs: the first seconds usually show it.
// A planted bug shows only when a read falls between its damage and the next publication,
// which the schedule decides, so a mutant's run is tried with up to three seeds: the checker
// must catch it in one of them (one run in four CI runs of a day missed the overwrite).
func TestTortureArtifacts(t *testing.T) {
	t.Parallel()
	payloadLine := regexp.MustCompile(`(ok|VIOLATED) +5 the payload belongs to the publication .* \((\d+) checked, (\d+) violations\)`)
	for _, tc := range []struct{ name, mutant string }{{"fenced", ""}, {"other pointer", "artifact-other-pointer"}, {"overwrite", "artifact-overwrite"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"--artifacts", "--duration", "4s", "--faults", "pause,kill,drop-reply"}
			if tc.mutant != "" {
				args = append(args, "--mutant", tc.mutant)
			}
			code, out := runTorture(t, "", args...)
			for seed := 4; tc.mutant != "" && code != 7 && seed <= 5; seed++ {
				t.Logf("mutant %s not caught with the first seed (exit %d); trying seed %d", tc.mutant, code, seed)
				code, out = runTorture(t, "", append(slices.Clone(args), "--seed", strconv.Itoa(seed))...)
			}
			m := payloadLine.FindStringSubmatch(out)
			if m == nil || m[2] == "0" {
				t.Fatalf("no read was checked against its publication: %q", m)
			}
			if !regexp.MustCompile(`artifact collection after the run: [1-9]\d* orphans deleted`).MatchString(out) {
				t.Error("the final collection deleted no orphans")
			}
			if tc.mutant == "" {
				if code != 0 || m[1] != "ok" || strings.Contains(out, "UNREADABLE ARTIFACT") {
					t.Fatalf("torture --artifacts: exit %d, want 0 and no violations", code)
				}
				return
			}
			if code != 7 || m[1] != "VIOLATED" {
				t.Fatalf("mutant %s: exit %d, want 7 and the payload rule violated", tc.mutant, code)
			}
		})
	}
}

// Bad input for --artifacts: one sentence, exit 2, no run.
func TestTortureArtifactsUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for args, want := range map[string]string{
		"torture --store file:///tmp/x":                      "--store needs --artifacts",
		"torture --artifacts --unfenced":                     "not implemented with --unfenced",
		"torture --mutant artifact-overwrite":                "needs --artifacts",
		"torture --artifacts --store nosuch://bucket":        "invalid --store",
		"torture --artifacts --store azblob://":              "invalid --store",
		"torture --artifacts --mutant no-such-mutant-at-all": "unknown mutant",
	} {
		r := runIn(t, dir, "", nil, strings.Fields(args)...)
		if r.code != 2 || !strings.Contains(r.stderr, want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("fenced %s: exit %d, stderr %q; want 2 and one sentence saying %q", args, r.code, r.stderr, want)
		}
	}
}
