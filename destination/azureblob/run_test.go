package azureblob_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
)

// The paused-writer schedule through fenced.Run with a real lease store, forced with
// channels: A writes the blob, is paused, its lease expires, B acquires; A's delayed write
// then arrives before B writes. With B fencing the blob on acquisition Azure refuses it;
// without, it is accepted (the gap), and B, which never took the blob lease over, cannot write.
func TestRunFencesTheBlob(t *testing.T) {
	t.Parallel()
	for _, fence := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithFence", false: "WithoutFence"}[fence], func(t *testing.T) {
			ctx := context.Background()
			blob := azureblob.NewLeased(containerForTest(t), nil)
			drv, err := sqlite.Open(filepath.Join(t.TempDir(), "fenced.db"))
			if err != nil {
				t.Fatal(err)
			}
			store, err := fenced.New(ctx, drv, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if err := store.Provision(ctx, res); err != nil {
				t.Fatal(err)
			}
			// A always fences: it is B's choice that the schedule is about.
			aPaused, aResume, aDone := make(chan fenced.Token), make(chan struct{}), make(chan error)
			go func() {
				_, _ = fenced.Run(ctx, store, res, &fenced.RunOptions{TTL: time.Minute, Fence: []fenced.Fencer{blob}},
					func(_ context.Context, l *fenced.Lease) ([]byte, error) {
						if err := blob.Write(ctx, res, l.Owner(), l.Token(), []byte("A first\x00")); err != nil {
							t.Errorf("A's first write: %v", err)
						}
						aPaused <- l.Token()
						<-aResume // paused past its lease
						aDone <- blob.Write(ctx, res, l.Owner(), l.Token(), []byte("A delayed"))
						return nil, nil
					})
			}()
			a := <-aPaused
			if _, err := drv.DB().Exec(`UPDATE fenced_resources SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
				WHERE resource = ?`, res); err != nil {
				t.Fatal(err)
			}
			var opts fenced.RunOptions
			opts.TTL = time.Minute
			if fence {
				opts.Fence = []fenced.Fencer{blob}
			}
			bAcquired, bWrite, bDone := make(chan fenced.Token), make(chan struct{}), make(chan error)
			go func() {
				_, err := fenced.Run(ctx, store, res, &opts, func(_ context.Context, l *fenced.Lease) ([]byte, error) {
					bAcquired <- l.Token()
					<-bWrite
					return nil, blob.Write(ctx, res, l.Owner(), l.Token(), []byte("B"))
				})
				bDone <- err
			}()
			b := <-bAcquired
			close(aResume)
			errA := <-aDone
			close(bWrite)
			errB := <-bDone
			data, written, err := blob.Read(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			if fence {
				var stale *destination.StaleError
				if !errors.As(errA, &stale) || errB != nil || string(data) != "B" || written != b {
					t.Fatalf("fenced: A's delayed write %v, B's %v, blob %q by %s (A %s, B %s)", errA, errB, data, written, a, b)
				}
				return
			}
			if errA != nil || !errors.Is(errB, destination.ErrStale) || string(data) != "A delayed" || written != a {
				t.Fatalf("unfenced: A's delayed write %v, B's %v, blob %q by %s; want A's accepted (the gap) and B refused", errA, errB, data, written)
			}
		})
	}
}
