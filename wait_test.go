package fenced

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/sqlite"
)

// postgresTestSchema returns a URL on a schema of its own, dropped at the end. Without a server
// it skips loudly, and fails under CI (as drivertest.ServerURL, which this package cannot import).
func postgresTestSchema(t testing.TB) string {
	base := os.Getenv("FENCED_TEST_POSTGRES")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		msg := "!!! FENCED_TEST_POSTGRES=" + base + " is not reachable (" + err.Error() + ")"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	defer conn.Close(ctx)
	schema := "fenced_wait_" + strings.ToLower(rand.Text()[:16])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// postgresStore opens a store with a pool and listening connection of its own on url, as
// another process would.
func postgresStore(t testing.TB, url string, cfg *Config) *Store {
	t.Helper()
	d, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitStore opens a store on a new SQLite file, its epoch bumped so that epoch != generation.
func waitStore(t *testing.T, path string, opts ...sqlite.Option) *Store {
	t.Helper()
	d, err := sqlite.Open(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

const waitResource = "wait für Q3"

// TestAcquireWaitFIFO: waiters of one Store are granted in the order they arrived; each
// release through the Store hands the lease to the next one without polling.
func TestAcquireWaitFIFO(t *testing.T) {
	s := waitStore(t, filepath.Join(t.TempDir(), "w.db"))
	ctx := context.Background()
	if err := s.Provision(ctx, waitResource); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	joined := make(chan struct{}, 16)
	s.waits.hook = func(event string, _ time.Duration) {
		if event == "join" {
			joined <- struct{}{}
		}
	}
	holder, err := s.Acquire(ctx, waitResource, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	granted := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.AcquireWait(ctx, waitResource, time.Hour)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			granted <- i
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		<-joined // the next waiter arrives only after this one has queued
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(granted)
	want := 0
	for i := range granted {
		if i != want {
			t.Fatalf("waiter %d was granted in place %d", i, want)
		}
		want++
	}
	if want != n {
		t.Fatalf("%d of %d waiters were granted", want, n)
	}
	if st, err := s.Show(ctx, waitResource); err != nil || st.Generation != n+1 {
		t.Fatalf("after the waiters: %+v, %v; want generation %d", st, err, n+1)
	}
}

// TestAcquireWaitUsesTheDatabaseClock: the database's clock is an hour behind this machine's.
// A waiter that judged the holder's ten-minute lease by its own clock would think it over and
// retry without pause; the waiter sleeps its back-off instead. The lease is then expired on
// the database's clock by another store (no in-process wake), and the waiter gets it.
func TestAcquireWaitUsesTheDatabaseClock(t *testing.T) {
	dir := t.TempDir()
	offset := filepath.Join(dir, "offset")
	if err := os.WriteFile(offset, []byte(strconv.FormatInt(-time.Hour.Microseconds(), 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "w.db")
	holderStore := waitStore(t, path, sqlite.WithClockOffsetFile(offset))
	waiterStore := waitStore(t, path, sqlite.WithClockOffsetFile(offset))
	ctx := context.Background()
	if err := holderStore.Provision(ctx, waitResource); err != nil {
		t.Fatal(err)
	}
	holder, err := holderStore.Acquire(ctx, waitResource, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const sleeps = 6
	var delays []time.Duration
	expire := make(chan struct{})
	waiterStore.waits.hook = func(event string, d time.Duration) {
		if event != "sleep" {
			return
		}
		delays = append(delays, d)
		if len(delays) == sleeps {
			close(expire)
		}
	}
	done := make(chan error, 1)
	var got *Lease
	go func() {
		var err error
		got, err = waiterStore.AcquireWait(ctx, waitResource, time.Minute)
		done <- err
	}()
	<-expire
	// The holder's lease runs out on the database's clock: its row's expiry moves to the past.
	sd := holderStore.Driver().(*sqlite.Driver)
	if _, err := sd.DB().ExecContext(ctx, `UPDATE fenced_resources SET lease_until = lease_until - 3600000000 WHERE resource = ?`, waitResource); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	for i, d := range delays[:sleeps] {
		if d < DefaultWaitPollMin/2 {
			t.Fatalf("sleep %d was %s: the waiter judged the lease by its own clock (delays %v)", i, d, delays)
		}
	}
	if got.Token().Compare(holder.Token()) <= 0 {
		t.Fatalf("the waiter's token %s is not after the holder's %s", got.Token(), holder.Token())
	}
	if err := holder.Publish(ctx, []byte("late")); !errors.Is(err, ErrRefused) {
		t.Fatalf("the expired holder published after the waiter's grant: %v", err)
	}
}

// TestAcquireWaitGivesUpWithCtx: when ctx ends first, the error is busy and names ctx's end.
func TestAcquireWaitGivesUpWithCtx(t *testing.T) {
	s := waitStore(t, filepath.Join(t.TempDir(), "w.db"))
	ctx := context.Background()
	if err := s.Provision(ctx, waitResource); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, waitResource, time.Hour); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	sleeps := 0
	s.waits.hook = func(event string, _ time.Duration) {
		if event == "sleep" {
			if sleeps++; sleeps == 3 {
				cancel()
			}
		}
	}
	_, err := s.AcquireWait(wctx, waitResource, time.Minute)
	if !errors.Is(err, ErrBusy) || !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireWait after ctx ended: %v, want busy and canceled", err)
	}
	var busy *BusyError
	if !errors.As(err, &busy) || busy.Resource != waitResource || busy.Generation != 1 ||
		!strings.HasPrefix(err.Error(), fmt.Sprintf("gave up waiting for %q after ", waitResource)) {
		t.Fatalf("AcquireWait after ctx ended: %v, want the *BusyError of generation 1 and what was waited for", err)
	}
	if _, err := s.AcquireWait(ctx, waitResource, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AcquireWait with ttl 0: %v", err)
	}
}

// TestAcquireWaitGivesUpQueued: a waiter queued behind an earlier waiter of the same Store
// whose ctx ends gives up busy (with the earlier waiter's last answer) and with ctx's error,
// having sent nothing; so does one whose ctx ended before its first attempt.
func TestAcquireWaitGivesUpQueued(t *testing.T) {
	s := waitStore(t, filepath.Join(t.TempDir(), "w.db"))
	ctx := context.Background()
	if err := s.Provision(ctx, waitResource); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	holder, err := s.Acquire(ctx, waitResource, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	slept := make(chan struct{}, 1)
	s.waits.hook = func(event string, _ time.Duration) {
		if event == "sleep" {
			select {
			case slept <- struct{}{}:
			default:
			}
		}
	}
	actx, cancelA := context.WithCancel(ctx)
	defer cancelA()
	doneA := make(chan error, 1)
	go func() {
		_, err := s.AcquireWait(actx, waitResource, time.Minute)
		doneA <- err
	}()
	<-slept // A is first in line and has heard busy

	bctx, cancelB := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelB()
	_, err = s.AcquireWait(bctx, waitResource, time.Minute)
	if !errors.Is(err, ErrBusy) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("a queued waiter whose ctx ended: %v, want busy and deadline exceeded", err)
	}
	var busy *BusyError
	if !errors.As(err, &busy) || busy.Resource != waitResource || busy.Token != holder.Token() ||
		!strings.Contains(err.Error(), "queued behind an earlier waiter") {
		t.Fatalf("a queued waiter whose ctx ended: %v (%+v), want the holder's %s as A last heard it, and that it was queued",
			err, busy, holder.Token())
	}
	cancelA()
	if err := <-doneA; !errors.Is(err, ErrBusy) || !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter A: %v", err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// First in line, ctx over before the first attempt: nothing sent, busy, the resource untouched.
	over, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.AcquireWait(over, waitResource, time.Minute)
	if !errors.Is(err, ErrBusy) || !errors.Is(err, context.Canceled) || !errors.As(err, &busy) || busy.Generation != 0 {
		t.Fatalf("AcquireWait with ctx over: %v, want busy with no holder, and canceled", err)
	}
	if st, err := s.Show(ctx, waitResource); err != nil || st.Held() || st.Generation != holder.Generation() {
		t.Fatalf("after a wait that sent nothing: %+v, %v", st, err)
	}
}

// TestAcquireWaitWokenByPostgres: the waiter's store and the holder's are separate (as two
// processes are), and the waiter's every sleep would outlast the test: only the engine's
// signal of the release (LISTEN/NOTIFY) can wake it.
func TestAcquireWaitWokenByPostgres(t *testing.T) {
	url := postgresTestSchema(t)
	holderStore, waiterStore := postgresStore(t, url, nil), postgresStore(t, url, nil)
	ctx := context.Background()
	if err := holderStore.Provision(ctx, waitResource); err != nil {
		t.Fatal(err)
	}
	if _, err := holderStore.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	for _, free := range []string{"release", "publish and release", "epoch bump"} {
		holder, err := holderStore.Acquire(ctx, waitResource, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		slept := make(chan struct{}, 1)
		waiterStore.waits.fixedDelay = time.Hour
		waiterStore.waits.hook = func(event string, _ time.Duration) {
			switch event {
			case "sleep":
				select {
				case slept <- struct{}{}:
				default:
				}
			case "no-signal":
				t.Error("the waiter could not subscribe to freed leases")
			}
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		done := make(chan error, 1)
		var got *Lease
		go func() {
			var err error
			got, err = waiterStore.AcquireWait(wctx, waitResource, time.Minute)
			done <- err
		}()
		<-slept // busy, and asleep for an hour
		switch free {
		case "release":
			err = holder.Release(ctx)
		case "publish and release":
			err = holder.PublishAndRelease(ctx, []byte("done\x00"))
		default:
			_, err = holderStore.BumpEpoch(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("after %s, the waiter: %v", free, err)
		}
		cancel()
		if got.Token().Compare(holder.Token()) <= 0 {
			t.Fatalf("after %s the waiter got %s, not after %s", free, got.Token(), holder.Token())
		}
		if err := got.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireWaitOnWaiting: OnWaiting's function runs once when the acquisition has to wait
// (after a busy answer, or queued behind an earlier waiter), and not when it is granted at once.
func TestAcquireWaitOnWaiting(t *testing.T) {
	s := waitStore(t, filepath.Join(t.TempDir(), "w.db"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Provision(ctx, waitResource); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	var calls [3]int
	holder, err := s.AcquireWait(ctx, waitResource, time.Hour, OnWaiting(func() { calls[0]++ }))
	if err != nil || calls[0] != 0 {
		t.Fatalf("granted at once: %v, OnWaiting called %d times", err, calls[0])
	}
	waiting := make(chan int, 2)
	granted := make(chan *Lease, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			l, err := s.AcquireWait(ctx, waitResource, time.Hour, OnWaiting(func() { calls[i]++; waiting <- i }))
			if err != nil {
				t.Error(err)
			}
			granted <- l
		}()
		select {
		case got := <-waiting: // 1 after its busy answer, 2 queued behind 1
			if got != i {
				t.Fatalf("waiter %d said it waits, want %d", got, i)
			}
		case <-ctx.Done():
			t.Fatalf("waiter %d never said it waits", i)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		l := <-granted
		if l == nil {
			t.FailNow()
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if calls != [3]int{0, 1, 1} {
		t.Fatalf("OnWaiting calls %v, want once per waiter that waited", calls)
	}
}
