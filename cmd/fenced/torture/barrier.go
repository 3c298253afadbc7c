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
//
// flock grants a shared lock whenever no exclusive one is held, even while an exclusive
// request waits: with many workers there is almost always a request in flight, and a nemesis
// waiting for a moment with none can wait forever (it did: at 24 workers on SQLite the
// restore's hold gave up after 10 s, or got its moment so late that the restore ran after the
// workers had stopped). So a request first passes a
// turnstile, a second file it holds shared only for the two calls of Enter; the nemesis
// closes the turnstile (exclusively: it waits only for a worker inside Enter), then waits
// for the requests in flight to return, none can start meanwhile.
type Barrier struct {
	f, turnstile *os.File
	closed       func() // a test's hook: Hold has closed the turnstile
}

// OpenBarrier opens (creating them) the barrier file at path and its turnstile, path + ".gate".
func OpenBarrier(path string) (*Barrier, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open barrier: %w", err)
	}
	gate, err := os.OpenFile(path+".gate", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("open barrier: %w", err)
	}
	return &Barrier{f: f, turnstile: gate}, nil
}

// flock retries the flock(2) call while a signal interrupts it.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Enter waits until the nemesis does not hold the barrier and holds it shared.
func (g *Barrier) Enter() error {
	if err := flock(g.turnstile, unix.LOCK_SH); err != nil {
		return err
	}
	err := flock(g.f, unix.LOCK_SH)
	_ = flock(g.turnstile, unix.LOCK_UN)
	return err
}

// Leave lets go of the barrier after a request.
func (g *Barrier) Leave() { _ = flock(g.f, unix.LOCK_UN) }

// Hold takes the barrier exclusively, once every request in flight has returned, letting no
// new one start meanwhile; it gives up when ctx ends or after limit (a request stuck on the
// database). Release undoes it.
func (g *Barrier) Hold(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	if err := poll(ctx, g.turnstile, deadline, limit); err != nil {
		return err
	}
	if g.closed != nil {
		g.closed()
	}
	if err := poll(ctx, g.f, deadline, limit); err != nil {
		_ = flock(g.turnstile, unix.LOCK_UN)
		return err
	}
	return nil
}

// Release lets the requests held by Hold go on.
func (g *Barrier) Release() {
	_ = flock(g.f, unix.LOCK_UN)
	_ = flock(g.turnstile, unix.LOCK_UN)
}

// poll takes f exclusively, retrying until deadline: flock cannot be cancelled.
func poll(ctx context.Context, f *os.File, deadline time.Time, limit time.Duration) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
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

// Close closes the barrier's files, releasing any hold.
func (g *Barrier) Close() error {
	return errors.Join(g.f.Close(), g.turnstile.Close())
}
