package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
)

// TestClassify: only errors after which the script certainly did not run, or wrote nothing,
// are not applied.
func TestClassify(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errors.New("connection refused"))}
	read := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		err        error
		notApplied bool
	}{
		{goredis.ErrNoScript, true},
		{fmt.Errorf("wrapped: %w", goredis.ErrNoScript), true},
		{goredis.ErrClosed, true},
		{goredis.ErrPoolTimeout, true},
		{dial, true},
		{goredis.Nil, false},
		{io.EOF, false},
		{io.ErrUnexpectedEOF, false},
		{read, false},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
	} {
		if got := errors.Is(classify(c.err), driver.ErrNotApplied); got != c.notApplied {
			t.Errorf("classify(%v) not applied = %v, want %v", c.err, got, c.notApplied)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) is not nil")
	}
}

// TestRunWithDoneContextSendsNothing: a context that ended before the call is not applied.
func TestRunWithDoneContextSendsNothing(t *testing.T) {
	d := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}), nil)
	defer d.client.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Release(ctx, driver.LeaseRef{Resource: "r", Owner: "o", Epoch: 1, Generation: 1}); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("release with a done context: %v", err)
	}
}
