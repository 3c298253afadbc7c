package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/cmd/fenced/cli"
)

// TestAcquireWait: --wait gives up busy (exit 3) when the holder keeps the lease, and gets the
// lease once the holder's lease runs out on the database's clock.
func TestAcquireWait(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		res := "wait für ü"
		tg.ok(nil, "provision", res)
		tg.ok(nil, "epoch", "bump")
		var long leaseOut
		if err := json.Unmarshal(tg.ok(nil, "acquire", res, "--ttl", "1h"), &long); err != nil {
			t.Fatal(err)
		}
		// The sentence says what was waited for, how long, and the lease that is still held.
		msg := tg.fails(cli.ExitBusy, nil, "acquire", res, "--ttl", "1m", "--wait", "300ms")
		if want := fmt.Sprintf("fenced: gave up waiting for %q after ", res); !strings.HasPrefix(msg, want) ||
			!strings.Contains(msg, ": lease "+long.Token+" is still held, until ") {
			t.Errorf("gave up: %q, want it to start %q and name lease %s", msg, want, long.Token)
		}
		tg.fails(cli.ExitUsage, nil, "acquire", res, "--ttl", "1m", "--wait", "-1s")
		tg.ok(nil, leaseArgs("release", res, long)...)

		var short, next leaseOut
		if err := json.Unmarshal(tg.ok(nil, "acquire", res, "--ttl", "500ms"), &short); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(tg.ok(nil, "acquire", res, "--ttl", "1m", "--wait", "1m"), &next); err != nil {
			t.Fatal(err)
		}
		if next.Generation != short.Generation+1 || next.Epoch != short.Epoch {
			t.Fatalf("waited for %+v, got %+v", short, next)
		}
		tg.fails(cli.ExitRefused, []byte("late"), leaseArgs("publish", res, short)...)
	})
}

// TestAcquireWaitInService: `fenced --db http://… acquire R --ttl D --wait D` waits in the
// service (its waiter is counted in the service's fenced_waiters gauge, the barrier before
// the holder lets go) and gets the lease when the holder releases, and again when an epoch
// bump frees the holder's lease.
func TestAcquireWaitInService(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startService(t, "--db", "sqlite:"+filepath.Join(dir, "service.db"))
	tg := target{t: t, url: s.url, dir: dir}
	res := "wait in service ü"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	for _, free := range []string{"release", "epoch bump"} {
		holder := tg.acquire(res, "1h")
		got := make(chan result, 1)
		go func() { got <- runAsync(dir, s.url, "acquire", res, "--ttl", "1m", "--wait", "1m") }()
		waitForWaiters(t, s.url, 1)
		if free == "release" {
			tg.ok(nil, leaseArgs("release", res, holder)...)
		} else {
			tg.ok(nil, "epoch", "bump")
		}
		r := <-got
		if r.code != 0 {
			t.Fatalf("%s: the waiter exited %d: %s", free, r.code, r.stderr)
		}
		next := decode[leaseOut](t, r.stdout)
		if next.Generation != holder.Generation+1 || (free == "release") != (next.Epoch == holder.Epoch) {
			t.Fatalf("%s: the holder had %s, the waiter got %s", free, holder.Token, next.Token)
		}
		tg.ok(nil, leaseArgs("release", res, next)...)
	}
}

// TestAcquireWaitInServiceQueued: a waiter queued in the service behind an earlier one gives
// up busy (exit 3), not outcome unknown, and the earlier one still gets the lease.
func TestAcquireWaitInServiceQueued(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startService(t, "--db", "sqlite:"+filepath.Join(dir, "service.db"))
	tg := target{t: t, url: s.url, dir: dir}
	res := "queued in service ü"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	holder := tg.acquire(res, "1h")
	got := make(chan result, 1)
	go func() { got <- runAsync(dir, s.url, "acquire", res, "--ttl", "1m", "--wait", "1m") }()
	waitForWaiters(t, s.url, 1)
	msg := tg.fails(cli.ExitBusy, nil, "acquire", res, "--ttl", "1m", "--wait", "300ms")
	if want := fmt.Sprintf("fenced: gave up waiting for %q after ", res); !strings.HasPrefix(msg, want) {
		t.Errorf("the queued waiter: %q, want it to start %q", msg, want)
	}
	tg.ok(nil, leaseArgs("release", res, holder)...)
	r := <-got
	if r.code != 0 {
		t.Fatalf("the first waiter exited %d: %s", r.code, r.stderr)
	}
	if next := decode[leaseOut](t, r.stdout); next.Generation != holder.Generation+1 {
		t.Fatalf("the holder had %s, the first waiter got %s", holder.Token, next.Token)
	}
}

// runAsync runs the binary like runIn, for a goroutine: it reports failures in its result.
func runAsync(dir, db string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FENCED_DB="+db)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{code: cmd.ProcessState.ExitCode(), stdout: stdout.Bytes(), stderr: stderr.String()}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		r.code, r.stderr = -1, err.Error()
	}
	return r
}

// waitForWaiters returns once the service at url counts n waiting acquisitions.
func waitForWaiters(t *testing.T, url string, n int) {
	t.Helper()
	want := fmt.Sprintf("fenced_waiters %d\n", n)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service does not count %d waiters after 30 s", n)
		}
		<-time.After(10 * time.Millisecond) // a polling interval: the condition above orders the test
	}
}

// TestWaitInServiceRenewsLateGrant holds acquireWaitInEngine to its comment: a lease granted
// after a wait longer than the safety margin is renewed at once, so that its trust window runs
// from after the grant, not from the wait's request. The margin is 1ms, so any wait outlasts
// it; the barrier is the service counting the waiter before the holder releases.
func TestWaitInServiceRenewsLateGrant(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	svc := startService(t, "--db", "sqlite:"+filepath.Join(dir, "service.db"))
	tg := target{t: t, url: svc.url, dir: dir}
	const res, ttl, margin = "late grant", 30 * time.Second, time.Millisecond
	tg.ok(nil, "provision", res)
	holder := tg.acquire(res, "1h")

	drv, err := remote.Open(svc.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := fenced.New(context.Background(), drv, &fenced.Config{SafetyMargin: margin, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	type grant struct {
		l   *fenced.Lease
		err error
	}
	got := make(chan grant, 1)
	go func() {
		l, err := s.AcquireWait(context.Background(), res, ttl)
		got <- grant{l, err}
	}()
	waitForWaiters(t, svc.url, 1)
	released := time.Now() // the grant comes after this, and so does any renewal
	tg.ok(nil, leaseArgs("release", res, holder)...)
	g := <-got
	if g.err != nil {
		t.Fatal(g.err)
	}
	t.Cleanup(func() { _ = g.l.Release(context.Background()) })
	if want := released.Add(ttl - margin); g.l.TrustUntil().Before(want) {
		t.Fatalf("trusted until %s, before the release + TTL - margin %s: the window still ran from the wait's request",
			g.l.TrustUntil().Format(time.StampMicro), want.Format(time.StampMicro))
	}
}
