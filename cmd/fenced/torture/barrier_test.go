package torture

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestBarrierHoldNotStarved: requests that overlap without a gap (each enters before the one
// before it leaves, as many workers' requests do) must not keep the nemesis out: Hold closes
// the turnstile and gets the barrier once the requests in flight return.
func TestBarrierHoldNotStarved(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "barrier")
	const runners = 3
	bars := make([]*Barrier, runners)
	for i := range bars {
		b, err := OpenBarrier(path)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		bars[i] = b
	}
	nemesis, err := OpenBarrier(path)
	if err != nil {
		t.Fatal(err)
	}
	defer nemesis.Close()
	turnstileClosed := make(chan struct{})
	nemesis.closed = func() { close(turnstileClosed) }

	// A relay: runner i enters when it has the token, hands the token on, and leaves only once
	// the next runner has entered, or once the nemesis has closed the turnstile and the next
	// one has not entered for a second (it waits in Enter). Without the turnstile, the
	// barrier would never be free.
	token := make([]chan struct{}, runners)
	entered := make([]chan struct{}, runners)
	for i := range token {
		token[i], entered[i] = make(chan struct{}, 1), make(chan struct{}, 1)
	}
	stop, running := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for i := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := (i + 1) % runners
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				case <-token[i]:
				}
				if err := bars[i].Enter(); err != nil {
					t.Error(err)
					return
				}
				if i == 0 && round == 0 {
					close(running) // runner 0's first entry has no runner before it waiting
				} else {
					signal(entered[i])
				}
				signal(token[next])
				select {
				case <-entered[next]:
				case <-turnstileClosed:
					// The next runner should now be kept out; if it enters all the same
					// (within a second, long for a flock), keep the overlap.
					timer := time.NewTimer(time.Second)
					select {
					case <-entered[next]:
					case <-timer.C:
					}
					timer.Stop()
				}
				bars[i].Leave()
			}
		}()
	}
	token[0] <- struct{}{}
	<-running
	err = nemesis.Hold(context.Background(), 6*time.Second)
	if err == nil {
		nemesis.Release()
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the nemesis was kept out by overlapping requests: %v", err)
	}
}

// signal sends on a channel of one without waiting: once the nemesis holds the turnstile the
// relay's signals may go unread.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
