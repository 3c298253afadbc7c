// Package destinationtest is the conformance suite every destination passes: the fence holds
// (a takeover refuses the previous holder's writes before the new holder writes), tokens
// compare epoch first, a fence never goes back, and the gap without fencing on acquisition is
// real. Each destination's tests call Run with a Harness.
package destinationtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination"
)

// Harness is one destination under test, isolated from every other test's.
type Harness struct {
	// Fencer is the destination.
	Fencer fenced.Fencer
	// Provision makes resource known to the destination (a gate's Add); nil if nothing is needed.
	Provision func(ctx context.Context, resource string) error
	// Write writes data to resource the way a holder of token does. A refusal must match
	// destination.ErrStale and change nothing.
	Write func(ctx context.Context, resource string, token fenced.Token, data []byte) error
	// Read returns the data of the last accepted write.
	Read func(ctx context.Context, resource string) ([]byte, error)
}

// Epoch is a recent epoch as backends derive it from their clock (microseconds since 1970), so
// that no test passes because epoch and generation coincide.
const Epoch = int64(1796132345000000)

// Run runs the suite; newHarness is called once per subtest.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, h Harness, resource string)
	}{
		{"FenceThenWrite", testFenceThenWrite},
		{"TakeoverRefusesOlderBeforeNewerWrites", testTakeover},
		{"GapWithoutFencingOnAcquisition", testGap},
		{"FenceNeverGoesBack", testFenceNeverGoesBack},
		{"EpochBeforeGeneration", testEpochOrder},
		{"RacingFencesNewestWins", testRacingFences},
		{"ResourcesAreIndependent", testIndependent},
		{"BadTokensRefused", testBadTokens},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			h := newHarness(t)
			resource := "rapport nº 7; ü"
			provision(t, ctx, h, resource)
			tc.fn(t, ctx, h, resource)
		})
	}
}

// BadTokens are tokens no lease store issues: the zero Token, and tokens with a zero or
// negative epoch or generation.
var BadTokens = []fenced.Token{{}, {Epoch: 0, Generation: 4}, {Epoch: Epoch, Generation: 0},
	{Epoch: -1, Generation: 4}, {Epoch: Epoch, Generation: -1}}

// RefuseBadTokens fences and writes resource through h with each of BadTokens and fails the
// test unless every call is refused with an error matching destination.ErrMalformed. It does
// not look at the destination: the caller checks that nothing changed.
func RefuseBadTokens(t *testing.T, ctx context.Context, h Harness, resource string) {
	t.Helper()
	for _, bad := range BadTokens {
		if err := h.Fencer.Fence(ctx, resource, bad); !errors.Is(err, destination.ErrMalformed) {
			t.Fatalf("fence %q with %s: %v, want destination.ErrMalformed", resource, bad, err)
		}
		if err := h.Write(ctx, resource, bad, []byte("bad")); !errors.Is(err, destination.ErrMalformed) {
			t.Fatalf("write %q with %s: %v, want destination.ErrMalformed", resource, bad, err)
		}
	}
}

// testBadTokens: every token no lease store issues is refused as malformed, by the fence and
// by a write, and changes nothing: the data written under a real token stays, and the next
// real token still fences.
func testBadTokens(t *testing.T, ctx context.Context, h Harness, resource string) {
	a, b := fenced.Token{Epoch: Epoch, Generation: 3}, fenced.Token{Epoch: Epoch, Generation: 4}
	if err := h.Fencer.Fence(ctx, resource, a); err != nil {
		t.Fatal(err)
	}
	if err := h.Write(ctx, resource, a, []byte("from a\x00")); err != nil {
		t.Fatal(err)
	}
	RefuseBadTokens(t, ctx, h, resource)
	got, err := h.Read(ctx, resource)
	if err != nil || string(got) != "from a\x00" {
		t.Fatalf("after the bad tokens: %q, %v; want a's data", got, err)
	}
	if err := h.Fencer.Fence(ctx, resource, b); err != nil {
		t.Fatalf("fence with %s after the bad tokens: %v", b, err)
	}
	if err := h.Write(ctx, resource, a, []byte("late a")); !errors.Is(err, destination.ErrStale) {
		t.Fatalf("a's write after b's fence: %v, want destination.ErrStale", err)
	}
}

func provision(t *testing.T, ctx context.Context, h Harness, resource string) {
	t.Helper()
	if h.Provision != nil {
		if err := h.Provision(ctx, resource); err != nil {
			t.Fatalf("provision %q: %v", resource, err)
		}
	}
}

func tok(e, g int64) fenced.Token { return fenced.Token{Epoch: Epoch + e, Generation: g} }

// payload returns distinct bytes with a NUL inside.
func payload(s string) []byte { return append([]byte(s+"\x00"), s...) }

func mustFence(t *testing.T, ctx context.Context, h Harness, r string, tk fenced.Token) {
	t.Helper()
	if err := h.Fencer.Fence(ctx, r, tk); err != nil {
		t.Fatalf("fence %q with %s: %v", r, tk, err)
	}
}

func mustWrite(t *testing.T, ctx context.Context, h Harness, r string, tk fenced.Token, data []byte) {
	t.Helper()
	if err := h.Write(ctx, r, tk, data); err != nil {
		t.Fatalf("write %q with %s: %v", r, tk, err)
	}
}

func mustRefuse(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, destination.ErrStale) {
		t.Fatalf("%s: got %v, want a refusal matching destination.ErrStale", what, err)
	}
}

func wantData(t *testing.T, ctx context.Context, h Harness, r string, want []byte) {
	t.Helper()
	got, err := h.Read(ctx, r)
	if err != nil {
		t.Fatalf("read %q: %v", r, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %q = %q, want %q", r, got, want)
	}
}

func testFenceThenWrite(t *testing.T, ctx context.Context, h Harness, r string) {
	a := tok(2, 5)
	mustFence(t, ctx, h, r, a)
	mustFence(t, ctx, h, r, a) // idempotent for the token it holds
	mustWrite(t, ctx, h, r, a, payload("one"))
	mustWrite(t, ctx, h, r, a, payload("two")) // many writes under one token
	wantData(t, ctx, h, r, payload("two"))
}

// The fence: once B has fenced, A's write is refused although B has written nothing.
func testTakeover(t *testing.T, ctx context.Context, h Harness, r string) {
	a, b := tok(2, 5), tok(2, 6)
	mustFence(t, ctx, h, r, a)
	mustWrite(t, ctx, h, r, a, payload("from A"))
	mustFence(t, ctx, h, r, b)
	mustRefuse(t, "A's write after B fenced", h.Write(ctx, r, a, payload("late A")))
	wantData(t, ctx, h, r, payload("from A"))
	mustWrite(t, ctx, h, r, b, payload("from B"))
	mustRefuse(t, "A's write after B wrote", h.Write(ctx, r, a, payload("later A")))
	wantData(t, ctx, h, r, payload("from B"))
}

// The gap every destination has without fencing on acquisition: B has acquired (token b) but
// has not fenced this destination, so A's delayed write is still accepted. Fencing closes it.
func testGap(t *testing.T, ctx context.Context, h Harness, r string) {
	a, b := tok(2, 5), tok(2, 6)
	mustFence(t, ctx, h, r, a)
	mustWrite(t, ctx, h, r, a, payload("from A"))
	// B acquires b in the lease store here, and does not fence.
	if err := h.Write(ctx, r, a, payload("delayed A")); err != nil {
		t.Fatalf("without fencing on acquisition A's delayed write should be accepted (the gap), got %v", err)
	}
	mustFence(t, ctx, h, r, b)
	mustRefuse(t, "A's write after B fenced", h.Write(ctx, r, a, payload("later A")))
	wantData(t, ctx, h, r, payload("delayed A"))
}

func testFenceNeverGoesBack(t *testing.T, ctx context.Context, h Harness, r string) {
	a, b := tok(2, 5), tok(2, 6)
	mustFence(t, ctx, h, r, b)
	mustRefuse(t, "fence with an older token", h.Fencer.Fence(ctx, r, a))
	var stale *destination.StaleError
	if err := h.Fencer.Fence(ctx, r, a); errors.As(err, &stale) && stale.Current != (fenced.Token{}) && stale.Current != b {
		t.Fatalf("refusal reports current %s, want %s", stale.Current, b)
	}
	mustRefuse(t, "write with an older token", h.Write(ctx, r, a, payload("A")))
	mustWrite(t, ctx, h, r, b, payload("B"))
	wantData(t, ctx, h, r, payload("B"))
}

// A token from an older epoch is older whatever its generation.
func testEpochOrder(t *testing.T, ctx context.Context, h Harness, r string) {
	old, bumped := tok(0, 50), tok(1, 1)
	mustFence(t, ctx, h, r, old)
	mustWrite(t, ctx, h, r, old, payload("old epoch"))
	mustFence(t, ctx, h, r, bumped)
	mustRefuse(t, "fence with an older epoch and a larger generation", h.Fencer.Fence(ctx, r, tok(0, 51)))
	mustRefuse(t, "write with an older epoch", h.Write(ctx, r, old, payload("stale")))
	mustWrite(t, ctx, h, r, bumped, payload("new epoch"))
	wantData(t, ctx, h, r, payload("new epoch"))
}

// Fences race, released together by a barrier; the newest token is left installed whatever
// the interleaving, and every older one is refused afterwards.
func testRacingFences(t *testing.T, ctx context.Context, h Harness, r string) {
	const n = 4
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = h.Fencer.Fence(ctx, r, tok(1, int64(10+i)))
		}()
	}
	close(start)
	wg.Wait()
	if errs[n-1] != nil {
		t.Fatalf("the newest fence failed: %v", errs[n-1])
	}
	for i, err := range errs[:n-1] {
		if err != nil && !errors.Is(err, destination.ErrStale) {
			t.Fatalf("fence %d: %v", i, err)
		}
		mustRefuse(t, fmt.Sprintf("write with token %d after the race", i), h.Write(ctx, r, tok(1, int64(10+i)), payload("old")))
	}
	mustWrite(t, ctx, h, r, tok(1, 10+n-1), payload("newest"))
	wantData(t, ctx, h, r, payload("newest"))
}

func testIndependent(t *testing.T, ctx context.Context, h Harness, r string) {
	other := "другой ресурс"
	provision(t, ctx, h, other)
	mustFence(t, ctx, h, r, tok(3, 9))
	mustFence(t, ctx, h, other, tok(1, 1))
	mustWrite(t, ctx, h, other, tok(1, 1), payload("other"))
	wantData(t, ctx, h, other, payload("other"))
}

// Paused is the outcome of PausedWriter: the two holders' tokens, A's delayed write, and B,
// held before its own write until FinishB.
type Paused struct {
	A, B    fenced.Token
	ErrA    error              // A's delayed write, made after B acquired and before B wrote
	FinishB func([]byte) error // lets B write the given bytes; B's Run's error
}

// PausedWriter forces the paused-writer schedule through fenced.Run on a real lease store
// (SQLite, in the test's temporary directory), with channels: A acquires, fences dest, writes
// "A first\x00" and is paused; its lease is expired in the store; B acquires, fencing dest on
// acquisition only if fence is set; then A's delayed write of "A delayed" arrives, before B
// writes anything. write writes data to resource as the holder of l. The epoch is bumped
// first, so that epoch and generation differ.
func PausedWriter(t *testing.T, dest fenced.Fencer, resource string, fence bool,
	write func(ctx context.Context, l *fenced.Lease, data []byte) error) Paused {
	t.Helper()
	ctx := context.Background()
	drv, err := sqlite.Open(filepath.Join(t.TempDir(), "fenced.db"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := fenced.New(ctx, drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	if err := store.Provision(ctx, resource); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BumpEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	aPaused, aResume, aDone := make(chan fenced.Token), make(chan struct{}), make(chan error)
	go func() {
		_, _ = fenced.Run(ctx, store, resource, &fenced.RunOptions{TTL: time.Minute, Fence: []fenced.Fencer{dest}},
			func(_ context.Context, l *fenced.Lease) ([]byte, error) {
				if err := write(ctx, l, []byte("A first\x00")); err != nil {
					t.Errorf("A's first write: %v", err)
				}
				aPaused <- l.Token()
				<-aResume // paused past its lease
				aDone <- write(ctx, l, []byte("A delayed"))
				return nil, nil
			})
	}()
	var p Paused
	p.A = <-aPaused
	if _, err := drv.DB().Exec(`UPDATE fenced_resources SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
		WHERE resource = ?`, resource); err != nil {
		t.Fatal(err)
	}
	opts := fenced.RunOptions{TTL: time.Minute}
	if fence {
		opts.Fence = []fenced.Fencer{dest}
	}
	bAcquired, bWrite, bDone := make(chan fenced.Token), make(chan []byte), make(chan error)
	go func() {
		_, err := fenced.Run(ctx, store, resource, &opts, func(_ context.Context, l *fenced.Lease) ([]byte, error) {
			bAcquired <- l.Token()
			return nil, write(ctx, l, <-bWrite)
		})
		bDone <- err
	}()
	p.B = <-bAcquired
	close(aResume)
	p.ErrA = <-aDone
	p.FinishB = func(data []byte) error { bWrite <- data; return <-bDone }
	return p
}
