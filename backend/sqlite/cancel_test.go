package sqlite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// TestCancelledReadsLeaveOthersAlone: reads whose contexts end while they run (modernc then calls
// sqlite3_interrupt on their connection) must not make any operation on a live context fail,
// neither the writer's statements nor other reads, which share the pool with the cancelled ones.
func TestCancelledReadsLeaveOthersAlone(t *testing.T) {
	resources := []string{"cancel ü one", "cancel ü two", "cancel ü three"}
	d := groupDriver(t, resources...)
	const (
		rounds      = 60
		cancellers  = 4
		liveReaders = 2
	)
	live := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 5*time.Second)
	}
	var (
		mu       sync.Mutex
		problems []string
		wg       sync.WaitGroup
	)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var cancelled, interrupted int
	for c := range cancellers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Deadlines from 0 to ~60 µs end some reads before they start, some while
				// they step and some just after they finished.
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((i*7+c*13)%60)*time.Microsecond)
				r := resources[(i+c)%len(resources)]
				var err error
				if i%2 == 0 {
					_, err = d.Read(ctx, r)
				} else {
					_, _, err = d.ReadPayload(ctx, r)
				}
				cancel()
				mu.Lock()
				if err != nil {
					cancelled++
					if !errors.Is(err, context.DeadlineExceeded) {
						interrupted++
					}
				}
				mu.Unlock()
			}
		}()
	}
	for c := range liveReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := live()
				r := resources[(i+c)%len(resources)]
				if _, err := d.Read(ctx, r); err != nil {
					report("read %q on a live context: %v", r, err)
				}
				cancel()
			}
		}()
	}
	var writers sync.WaitGroup
	for w, r := range resources {
		writers.Add(1)
		go func() {
			defer writers.Done()
			owner := fmt.Sprintf("owner %d", w)
			for i := range rounds {
				ctx, cancel := live()
				g, err := d.Acquire(ctx, r, owner, time.Minute)
				if err != nil {
					report("acquire %q round %d on a live context: %v (not applied: %v)", r, i, err, errors.Is(err, driver.ErrNotApplied))
					cancel()
					return
				}
				l := driver.LeaseRef{Resource: r, Owner: owner, Epoch: g.Epoch, Generation: g.Generation}
				pub := driver.Publication{Payload: []byte("p\x00" + r), OpID: fmt.Sprintf("op %d %d", w, i), SourceVersion: int64(i + 1)}
				if ok, err := d.Publish(ctx, l, pub); err != nil || !ok {
					report("publish %q round %d on a live context: ok=%v err=%v", r, i, ok, err)
				}
				// A refused acquisition reads the row on the caller's context: it must not fail either.
				if _, err := d.Acquire(ctx, r, "someone else", time.Minute); !errors.As(err, new(*driver.BusyError)) {
					report("second acquire %q round %d: want busy, got %v", r, i, err)
				}
				if ok, err := d.Release(ctx, l); err != nil || !ok {
					report("release %q round %d on a live context: ok=%v err=%v", r, i, ok, err)
				}
				cancel()
			}
		}()
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d reads cancelled, %d of them with an error other than the deadline", cancelled, interrupted)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestRefusedAcquireReadCancelled forces the schedule of the report: the acquisition is refused
// and committed, then its context ends before the read that explains the refusal. The refusal is
// certain, so the error must say not applied, never outcome unknown.
func TestRefusedAcquireReadCancelled(t *testing.T) {
	const r = "refused ü\x00 one"
	d := groupDriver(t, r)
	ctx := context.Background()
	if _, err := d.BumpEpoch(ctx); err != nil { // epoch != generation
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, r, "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The hook runs after the refusing transaction committed, before Acquire reads the row.
	setHooks(d, func(w *writer) { w.committed = func(int, error) { cancel() } })
	_, err := d.Acquire(actx, r, "other", time.Minute)
	setHooks(d, func(w *writer) { w.committed = nil })
	if err == nil {
		t.Fatal("the second acquisition was granted while the first lease is held")
	}
	var busy *driver.BusyError
	if !errors.As(err, &busy) && !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("refused acquisition whose explaining read was cancelled: %v; want busy or not applied, never an unknown outcome", err)
	}
	st, err := d.Read(ctx, r)
	if err != nil || st.Owner != "holder" {
		t.Fatalf("after the refusal: owner %q, err %v; want holder", st.Owner, err)
	}
}
