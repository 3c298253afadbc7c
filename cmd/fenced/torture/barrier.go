package torture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Barrier lets the nemesis hold every process's requests back for a moment, as an operator
// stops the application before a restore: each request holds the barrier shared (flock) from
// before its CALL record until after its RETURN, and the nemesis takes it exclusively. A
// process that dies releases its hold with its file descriptors. One Barrier is used by one
// goroutine at a time.
type Barrier struct{ f *os.File }

// OpenBarrier opens (creating it) the barrier file at path.
func OpenBarrier(path string) (*Barrier, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open barrier: %w", err)
	}
	return &Barrier{f: f}, nil
}

// Enter waits until the nemesis does not hold the barrier and holds it shared.
func (g *Barrier) Enter() error {
	for {
		err := unix.Flock(int(g.f.Fd()), unix.LOCK_SH)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Leave lets go of the barrier.
func (g *Barrier) Leave() { _ = unix.Flock(int(g.f.Fd()), unix.LOCK_UN) }

// Hold takes the barrier exclusively, once every request in flight has returned; it gives up
// when ctx ends or after limit (a request stuck on the database).
func (g *Barrier) Hold(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := unix.Flock(int(g.f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("hold barrier: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hold barrier: requests still in flight after %s", limit)
		}
		t := time.NewTimer(2 * time.Millisecond) // polling the lock: flock cannot be cancelled
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close closes the barrier file, releasing any hold.
func (g *Barrier) Close() error { return g.f.Close() }
