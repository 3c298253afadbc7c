package postgres

import (
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// TestNotifyReleased: a subscriber hears a release made through another driver (another
// process), not one of another resource; when the listening session is killed it is woken so
// that it checks, and a new subscription listens again.
func TestNotifyReleased(t *testing.T) {
	rawURL := testSchema(t, nil)
	waiter, holder := openDriver(t, rawURL), openDriver(t, rawURL)
	ctx := testCtx(t)
	if err := holder.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"r ü", "other"} {
		if err := holder.Provision(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	acquireRelease := func(resource string) {
		t.Helper()
		g, err := holder.Acquire(ctx, resource, "owner-1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := holder.Release(ctx, driver.LeaseRef{Resource: resource, Owner: "owner-1", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
			t.Fatalf("release: %v, %v", ok, err)
		}
	}
	sig, stop, err := waiter.NotifyReleased(ctx, "r ü")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	sigOther, stopOther, err := waiter.NotifyReleased(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()
	acquireRelease("other")
	<-sigOther // dispatched: a wrong delivery to "r ü" would be in sig by now
	select {
	case <-sig:
		t.Fatal("the release of another resource was delivered")
	default:
	}
	acquireRelease("r ü")
	select {
	case <-sig:
	case <-ctx.Done():
		t.Fatal("no signal for the release")
	}

	waiter.listen.mu.Lock()
	pid := waiter.listen.pid
	waiter.listen.mu.Unlock()
	if _, err := holder.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sig: // woken by the loss, so that it checks
	case <-ctx.Done():
		t.Fatal("the loss of the listening session woke nobody")
	}
	sig2, stop2, err := waiter.NotifyReleased(ctx, "r ü")
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	acquireRelease("r ü")
	select {
	case <-sig2:
	case <-ctx.Done():
		t.Fatal("no signal after listening again")
	}
}
