package azureblob_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// The paused-writer schedule through fenced.Run with a real lease store: A's delayed write
// arrives after B acquired and before B wrote. With B fencing the blob on acquisition Azure
// refuses it; without, it is accepted (the gap), and B, which never took the blob lease over,
// cannot write.
func TestRunFencesTheBlob(t *testing.T) {
	t.Parallel()
	for _, fence := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithFence", false: "WithoutFence"}[fence], func(t *testing.T) {
			ctx := context.Background()
			blob := azureblob.NewLeased(containerForTest(t), nil)
			p := destinationtest.PausedWriter(t, blob, res, fence, func(ctx context.Context, l *fenced.Lease, data []byte) error {
				return blob.Write(ctx, res, l.Owner(), l.Token(), data)
			})
			errB := p.FinishB([]byte("B"))
			data, written, err := blob.Read(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			if fence {
				var stale *destination.StaleError
				if !errors.As(p.ErrA, &stale) || errB != nil || string(data) != "B" || written != p.B {
					t.Fatalf("fenced: A's delayed write %v, B's %v, blob %q by %s (A %s, B %s)", p.ErrA, errB, data, written, p.A, p.B)
				}
				return
			}
			if p.ErrA != nil || !errors.Is(errB, destination.ErrStale) || string(data) != "A delayed" || written != p.A {
				t.Fatalf("unfenced: A's delayed write %v, B's %v, blob %q by %s; want A's accepted (the gap) and B refused", p.ErrA, errB, data, written)
			}
		})
	}
}
