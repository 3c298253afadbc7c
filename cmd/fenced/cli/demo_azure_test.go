package cli_test

import (
	"regexp"
	"strings"
	"testing"
)

// The Azure demo on Azurite: taken over on acquisition, Azure itself refuses A's stale upload
// (the lease ID mismatch is Azure's answer); with plain uploads A's report reaches readers
// while B owns the resource.
func TestDemoAzure(t *testing.T) {
	t.Parallel()
	az := azuriteURL(t)
	r := runIn(t, t.TempDir(), "", nil, "demo", "--destination", "azure", "--azure", az)
	out := string(r.stdout)
	if r.code != 0 {
		t.Fatalf("demo: exit %d, stderr %q\n%s", r.code, r.stderr, out)
	}
	run1, run2, ok := strings.Cut(out, "== Run 2")
	if !ok {
		t.Fatalf("no second run:\n%s", out)
	}
	for _, c := range []struct {
		text string
		want *regexp.Regexp
	}{
		{run1, regexp.MustCompile(`B +took the blob over: .* token \d+\.2 in the metadata`)},
		{run1, regexp.MustCompile(`A +Azure REFUSED A's upload \(.*token \d+\.1 is older than the destination's \d+\.2 \(Azure answered 412 LeaseIdMismatchWithBlobOperation\)\)`)},
		{run1, regexp.MustCompile(`A +exited with code 5`)},
		{run1, regexp.MustCompile(`readers of the blob now see no report`)},
		{run1, regexp.MustCompile(`B +wrote "report by B" with token \d+\.2 \(201\)`)},
		{run2, regexp.MustCompile(`A +Azure ACCEPTED A's upload`)},
		{run2, regexp.MustCompile(`readers of the blob now see "report by A" .*, while B owns the resource`)},
		{out, regexp.MustCompile(`(?m)^Result: fenced on acquisition, Azure itself refused the stale upload`)},
	} {
		if !c.want.MatchString(c.text) {
			t.Errorf("no line matching %s in:\n%s", c.want, c.text)
		}
	}
}

func TestDemoAzureBadEndpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for args, code := range map[string]int{
		"demo --destination azure --azure ftp://x/devstoreaccount1":            2,
		"demo --destination azure --azure http://127.0.0.1:1/devstoreaccount1": 1,
		"demo --destination blob": 2,
	} {
		r := runIn(t, dir, "", nil, strings.Fields(args)...)
		if r.code != code || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("fenced %s: exit %d, want %d and one sentence (stderr %q)", args, r.code, code, r.stderr)
		}
	}
}
