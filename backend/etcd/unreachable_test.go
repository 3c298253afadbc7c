package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// TestOpenFailsFastWhenUnreachable: with every endpoint refusing, a call of a driver from Open
// fails as soon as the dial does, with one sentence naming the server and the cause, and
// certainly not applied; it does not wait for its context to end (clientv3's default). With
// one endpoint of several refusing, calls wait for a live one and succeed.
func TestOpenFailsFastWhenUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := drivertest.ClosedAddr(t)
	down := openDriver(t, []string{addr}, newPrefix())
	err := down.Migrate(ctx)
	want := "cannot connect to the etcd server at " + addr + ": connection refused"
	if err == nil || err.Error() != want || ctx.Err() != nil {
		t.Fatalf("migrate with the server down: %v (context: %v), want %q before the context ends", err, ctx.Err(), want)
	}
	if !errors.Is(err, driver.ErrNotApplied) {
		t.Errorf("migrate with the server down: %v, want not applied", err)
	}

	// With a user, Open authenticates, within its dial timeout; the timeout is explained.
	if _, err := Open("etcd://user:pw@" + addr); err == nil || err.Error() != want {
		t.Errorf("open with a user and the server down: %v, want %q", err, want)
	}

	oneDown := openDriver(t, append([]string{drivertest.ClosedAddr(t)}, cluster.endpoints()...), newPrefix())
	if err := oneDown.Migrate(ctx); err != nil {
		t.Fatalf("migrate with one endpoint down of %d: %v", len(cluster.endpoints())+1, err)
	}
}
