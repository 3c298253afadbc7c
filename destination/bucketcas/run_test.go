package bucketcas_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// The paused-writer schedule through fenced.Run with a real lease store, on fake-gcs-server:
// A's delayed write arrives after B acquired and before B wrote. With B fencing the object on
// acquisition the write is refused; without, it is accepted (the gap), and B's later write
// still lands.
func TestRunFencesTheObject(t *testing.T) {
	t.Parallel()
	for _, fence := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithFence", false: "WithoutFence"}[fence], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := newCAS(t, gcsBucket(t), nil)
			p := destinationtest.PausedWriter(t, obj, res, fence, func(ctx context.Context, l *fenced.Lease, data []byte) error {
				return obj.Write(ctx, res, l.Token(), data)
			})
			data, written, err := obj.Read(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.FinishB([]byte("B")); err != nil {
				t.Fatalf("B: %v", err)
			}
			if fence {
				var stale *destination.StaleError
				if !errors.As(p.ErrA, &stale) || stale.Current != p.B || string(data) != "A first\x00" || written != p.B {
					t.Fatalf("fenced: A's delayed write %v, then the object %q by %s (A %s, B %s)", p.ErrA, data, written, p.A, p.B)
				}
				return
			}
			if p.ErrA != nil || string(data) != "A delayed" || written != p.A {
				t.Fatalf("unfenced: A's delayed write %v, then the object %q by %s; want A's accepted (the gap)", p.ErrA, data, written)
			}
		})
	}
}
