package azureblob_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
)

// paused is a fence held at each of its steps until the test lets it go on.
type paused struct {
	t      *testing.T
	at     chan string
	resume chan struct{}
	done   chan error
}

func pauseFence(ctx context.Context, t *testing.T, l *azureblob.Leased, resource, owner string, token fenced.Token) *paused {
	p := &paused{t: t, at: make(chan string), resume: make(chan struct{}), done: make(chan error, 1)}
	azureblob.SetFenceHook(l, func(step string) {
		select {
		case p.at <- step:
		case <-ctx.Done():
			return
		}
		select {
		case <-p.resume:
		case <-ctx.Done():
		}
	})
	go func() { p.done <- l.FenceOwner(ctx, resource, owner, token) }()
	return p
}

// reach waits until the fence stops at step.
func (p *paused) reach(step string) {
	p.t.Helper()
	select {
	case got := <-p.at:
		if got != step {
			p.t.Fatalf("the fence stopped at %q, want %q", got, step)
		}
	case err := <-p.done:
		p.t.Fatalf("the fence returned %v before %q", err, step)
	case <-time.After(30 * time.Second):
		p.t.Fatalf("the fence did not reach %q", step)
	}
}

func (p *paused) goOn() { p.resume <- struct{}{} }

// The handover, step by step: B's fence is held between its requests to Azure while A, the
// previous holder, writes and fences again. A's write is accepted until B breaks A's blob
// lease (B's fence has not returned: the gap between an acquisition and its fence), refused
// from then on; A's late fence may take the lease back while B's is under way, and B's fence
// then breaks it again, so that when B's fence returns B holds the blob and A is refused.
func TestLeasedHandover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := containerForTest(t)
	la, lb := azureblob.NewLeased(c, nil), azureblob.NewLeased(c, nil)
	a, b := tok(4, 5), tok(4, 6)
	if err := la.FenceOwner(ctx, res, "A", a); err != nil {
		t.Fatal(err)
	}
	if err := la.Write(ctx, res, "A", a, []byte("A1\x00")); err != nil {
		t.Fatal(err)
	}
	rawA := func() error { // what Azure says to A's lease ID, whatever this package does
		_, err := c.NewBlockBlobClient(res).Upload(ctx, streaming.NopCloser(bytes.NewReader([]byte("raw A"))), &blockblob.UploadOptions{
			AccessConditions: &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(azureblob.LeaseID(res, "A"))}}})
		return err
	}
	refused := func(what string) {
		t.Helper()
		if err := la.Write(ctx, res, "A", a, []byte("late A")); !errors.Is(err, destination.ErrStale) {
			t.Fatalf("%s: A's write: %v, want stale", what, err)
		}
		if err := rawA(); !bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation, bloberror.LeaseNotPresentWithBlobOperation) {
			t.Fatalf("%s: a raw upload with A's lease ID: %v, want a lease refusal", what, err)
		}
	}

	p := pauseFence(ctx, t, lb, res, "B", b)
	p.reach("read")
	if err := la.Write(ctx, res, "A", a, []byte("A2\x00")); err != nil {
		t.Fatalf("A's write before B broke its lease: %v", err)
	}
	p.goOn() // B's break was conditional on the ETag it read, which A's write changed
	p.reach("read")
	p.goOn()
	p.reach("broken")
	refused("after B broke A's lease")
	p.goOn()
	p.reach("acquired")
	refused("after B acquired the lease")
	if err := la.FenceOwner(ctx, res, "A", a); err != nil { // the blob still records a: A may take it back
		t.Fatalf("A's late fence while B's is under way: %v", err)
	}
	p.goOn() // B's token cannot be recorded under A's lease: B starts again
	p.reach("read")
	p.goOn()
	p.reach("broken")
	p.goOn()
	p.reach("acquired")
	p.goOn()
	if err := <-p.done; err != nil {
		t.Fatalf("B's fence: %v", err)
	}
	refused("after B's fence returned")
	var stale *destination.StaleError
	if err := la.FenceOwner(ctx, res, "A", a); !errors.As(err, &stale) || stale.Current != b {
		t.Fatalf("A's fence after B's returned: %v, want stale with current %s", err, b)
	}
	if data, written, err := lb.Read(ctx, res); err != nil || string(data) != "A2\x00" || written != b {
		t.Fatalf("read %q %s %v, want A's second write under B's recorded token", data, written, err)
	}
	azureblob.SetFenceHook(lb, func(string) {})
	if err := lb.Write(ctx, res, "B", b, []byte("B")); err != nil {
		t.Fatal(err)
	}
}

// A newer fence completes while B's is held after B acquired the lease: B's fence then finds
// the newer token and is refused, and only the newest holder writes.
func TestLeasedHandoverOvertaken(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := containerForTest(t)
	la, lb, lc := azureblob.NewLeased(c, nil), azureblob.NewLeased(c, nil), azureblob.NewLeased(c, nil)
	a, b, cc := tok(4, 5), tok(4, 6), tok(4, 7)
	if err := la.FenceOwner(ctx, res, "A", a); err != nil {
		t.Fatal(err)
	}
	p := pauseFence(ctx, t, lb, res, "B", b)
	p.reach("read")
	p.goOn()
	p.reach("broken")
	p.goOn()
	p.reach("acquired")
	if err := lc.FenceOwner(ctx, res, "C", cc); err != nil {
		t.Fatalf("C's fence while B's is under way: %v", err)
	}
	p.goOn()
	var stale *destination.StaleError
	if err := <-p.done; !errors.As(err, &stale) || stale.Current != cc {
		t.Fatalf("B's fence overtaken by C's: %v, want stale with current %s", err, cc)
	}
	for _, w := range []struct {
		owner string
		t     fenced.Token
		l     *azureblob.Leased
	}{{"A", a, la}, {"B", b, lb}} {
		if err := w.l.Write(ctx, res, w.owner, w.t, []byte("stale")); !errors.Is(err, destination.ErrStale) {
			t.Fatalf("%s's write after C's fence: %v, want stale", w.owner, err)
		}
	}
	if err := lc.Write(ctx, res, "C", cc, []byte("C")); err != nil {
		t.Fatal(err)
	}
}
