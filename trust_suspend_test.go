package fenced

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/trustclock"
)

// suspendStore is a store on SQLite with the resource provisioned and the epoch bumped.
func suspendStore(t *testing.T, resource string) *Store {
	t.Helper()
	s := waitStore(t, filepath.Join(t.TempDir(), "suspend.db"))
	ctx := context.Background()
	if err := s.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitDone waits for the lease's Done, bounded by the test's own deadline.
func waitDone(t *testing.T, l *Lease, what string) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Done did not close", what)
	}
}

// The trust window counts time the machine spends suspended (docs/INVARIANTS.md, invariant 11):
// after a suspend longer than the window, Err reports the lease lost at once, and Done closes
// at the clock watch's next look (Look here, so as not to wait for the second). With Go's own
// timer, which stops with CLOCK_MONOTONIC, Done stayed open for the rest of the minute.
func TestTrustWindowCountsASuspend(t *testing.T) {
	const resource = "suspended holder ü"
	s := suspendStore(t, resource)
	l, err := s.Acquire(context.Background(), resource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("a fresh lease: %v", err)
	}
	trustclock.Suspend(2 * time.Minute)
	err = l.Err()
	if !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "trust window") {
		t.Fatalf("Err right after a suspend past the window: %v, want the trust window ended", err)
	}
	if !l.TrustUntil().Before(time.Now()) {
		t.Errorf("TrustUntil %s is not in the past after the suspend", l.TrustUntil())
	}
	trustclock.Look()
	waitDone(t, l, "after a suspend past the window")
}

// A renewal answered after a suspend that ended the window does not open it again, as one
// answered after the timer fired does not: the database, whose clock did not jump here,
// accepts it, and the lease stays lost locally.
func TestRenewAfterASuspendKeepsTheWindowEnded(t *testing.T) {
	const resource = "renewed after a suspend ü"
	s := suspendStore(t, resource)
	l, err := s.Acquire(context.Background(), resource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	trustclock.Suspend(58 * time.Second) // past the 54 s window, inside the database's minute
	if err := l.Renew(context.Background(), time.Minute); err != nil {
		t.Fatalf("the database refused the renewal: %v", err)
	}
	if err := l.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("after the renewal: Err %v, want the trust window ended", err)
	}
	waitDone(t, l, "after the renewal")
}

// Run's build context ends when a suspend ends the window, without waiting for the TTL on
// Go's clock; nothing is published.
func TestRunStopsAfterASuspend(t *testing.T) {
	const resource = "run across a suspend ü"
	s := suspendStore(t, resource)
	building := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), s, resource, &RunOptions{TTL: time.Minute},
			func(ctx context.Context, _ *Lease) ([]byte, error) {
				close(building)
				<-ctx.Done()
				return []byte("built across a suspend \x00"), nil
			})
		errc <- err
	}()
	<-building
	trustclock.Suspend(2 * time.Minute)
	trustclock.Look()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Run: %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run's build went on after a suspend past the window")
	}
	st, err := s.Show(context.Background(), resource)
	if err != nil {
		t.Fatal(err)
	}
	if st.PublishedGeneration != 0 {
		t.Fatalf("published after the window ended: %+v", st)
	}
}

// blockedFencer answers a fence only when its context ends, after saying it was called.
type blockedFencer struct{ called chan struct{} }

func (f blockedFencer) Fence(ctx context.Context, resource string, token Token) error {
	close(f.called)
	<-ctx.Done()
	return context.Cause(ctx)
}

// A fence that outlasts the trust window (here a suspend ends it) stops Run before the build:
// the build never runs under a lease already lost, and nothing is published.
func TestRunNeverBuildsAfterASlowFence(t *testing.T) {
	const resource = "slow fence ü"
	s := suspendStore(t, resource)
	f := blockedFencer{called: make(chan struct{})}
	errc := make(chan error, 1)
	built := false
	go func() {
		_, err := Run(context.Background(), s, resource, &RunOptions{TTL: time.Minute, Fence: []Fencer{f}},
			func(ctx context.Context, _ *Lease) ([]byte, error) {
				built = true
				return []byte("built under a lost lease"), nil
			})
		errc <- err
	}()
	<-f.called
	trustclock.Suspend(2 * time.Minute)
	trustclock.Look()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "before the build could start") {
			t.Fatalf("Run: %v, want ErrLeaseLost before the build", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop when the trust window ended during the fence")
	}
	if built {
		t.Fatal("the build ran under a lost lease")
	}
}
