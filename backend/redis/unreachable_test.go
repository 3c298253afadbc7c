package redis_test

import (
	"errors"
	"net"
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// TestUnreachableIsOneSentence: a server that refuses the connection is named, with the
// cause, in one sentence that says nothing of scripts; the outcome is certain (nothing was
// sent) and go-redis's error stays reachable.
func TestUnreachableIsOneSentence(t *testing.T) {
	t.Parallel()
	addr := drivertest.ClosedAddr(t)
	d := open(t, "redis://"+addr+"/0")
	_, err := d.Read(testCtx(t), "r")
	want := "cannot connect to the Redis server at " + addr + ": connection refused"
	if err == nil || err.Error() != want {
		t.Fatalf("read with the server down: %v, want %q", err, want)
	}
	if !errors.Is(err, driver.ErrNotApplied) || !errors.As(err, new(*net.OpError)) {
		t.Errorf("read with the server down: %v is not applied %v, wraps the dial error %v", err,
			errors.Is(err, driver.ErrNotApplied), errors.As(err, new(*net.OpError)))
	}
}
