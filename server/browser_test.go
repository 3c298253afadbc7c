package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium finds Debian's chromium, or skips loudly (fails under CI).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "!!! no chromium on PATH: the dashboard's browser test needs Debian's chromium (apt-get install chromium)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestDashboardInBrowser loads the dashboard in a headless chromium: the resources appear with
// their holder and token, the expiry counts down, the refusal is listed with its cause, and a
// screenshot is saved (go test -artifacts keeps it; its path is logged).
func TestDashboardInBrowser(t *testing.T) {
	bin := chromium(t)
	h, store := sqliteService(t, nil)
	rs := remoteStore(t, h, "")
	ctx := testCtx(t)
	for _, name := range []string{"nightly build ü", "report/Q3"} {
		if err := rs.Provision(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rs.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := rs.Acquire(ctx, "nightly build ü", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := rs.Acquire(ctx, "report/Q3", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishAndRelease(ctx, []byte("q3\x00")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Release(ctx); err == nil { // refused: released already
		t.Fatal("a second release was accepted")
	}
	_ = store

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1200, 700))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()

	countdown := `document.querySelector('tr[data-resource="nightly build ü"] td.num')`
	if err := chromedp.Do(bctx, chromedp.Navigate(h.url()+"/"), chromedp.WaitVisible(`#resources tbody tr:nth-child(2)`)); err != nil {
		t.Fatalf("load the dashboard: %v", err)
	}
	must := func(v string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("browser: %v", err)
		}
		return v
	}
	heldRow := must(chromedp.Run(bctx, chromedp.Text(`tr[data-resource="nightly build ü"]`)))
	refusal := must(chromedp.Run(bctx, chromedp.Text(`#refusals tbody tr`)))
	first := must(chromedp.Run(bctx, chromedp.Evaluate[string](countdown+`.textContent`)))
	// The countdown ticks on its own, between two reads of the service.
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](countdown+`.textContent !== `+strconv.Quote(first))); err != nil {
		t.Fatalf("the countdown did not move from %q: %v", first, err)
	}
	second := must(chromedp.Run(bctx, chromedp.Evaluate[string](countdown+`.textContent`)))
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	for _, want := range []string{"held", held.Token().String(), held.Owner()[:8]} {
		if !strings.Contains(heldRow, want) {
			t.Errorf("the held row %q lacks %q", heldRow, want)
		}
	}
	if !strings.Contains(refusal, "released") || !strings.Contains(refusal, "report/Q3") {
		t.Errorf("the refusal row is %q", refusal)
	}
	secs := func(s string) float64 {
		v, err := strconv.ParseFloat(strings.TrimSuffix(s, " s"), 64)
		if err != nil {
			t.Fatalf("countdown %q", s)
		}
		return v
	}
	// The lease is ten minutes; the page may come up tens of seconds later on a loaded machine.
	if a, b := secs(first), secs(second); !(b < a) || a > 600 || a < 300 {
		t.Errorf("countdown %q then %q: want it within the ten-minute lease and falling", first, second)
	}
	path := filepath.Join(t.ArtifactDir(), "dashboard.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))
}
