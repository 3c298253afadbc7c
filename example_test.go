package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
)

// Run acquires a lease, builds under a context that dies with the lease, publishes the result
// and releases the lease.
func ExampleRun() {
	dir, _ := os.MkdirTemp("", "fenced-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	drv, err := sqlite.Open(filepath.Join(dir, "fenced.db"))
	if err != nil {
		panic(err)
	}
	store, err := fenced.New(ctx, drv, nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Provision(ctx, "report:42"); err != nil {
		panic(err)
	}

	res, err := fenced.Run(ctx, store, "report:42", &fenced.RunOptions{TTL: 30 * time.Second},
		func(ctx context.Context, lease *fenced.Lease) ([]byte, error) {
			return []byte("quarterly numbers"), nil
		})
	if err != nil {
		panic(err)
	}
	payload, gen, _ := store.Get(ctx, "report:42")
	fmt.Printf("published %q by generation %d (Run reported %d)\n", payload, gen, res.Generation)
	// Output: published "quarterly numbers" by generation 1 (Run reported 1)
}

// A worker whose lease was taken over is refused at the database, even before the new owner
// has written anything.
func ExampleLease_Publish_superseded() {
	dir, _ := os.MkdirTemp("", "fenced-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	drv, _ := sqlite.Open(filepath.Join(dir, "fenced.db"))
	store, _ := fenced.New(ctx, drv, nil)
	defer store.Close()
	_ = store.Provision(ctx, "report:42")

	a, _ := store.Acquire(ctx, "report:42", 50*time.Millisecond)
	<-a.Done() // A stalls past its lease (in real life: a GC pause, SIGSTOP, a slow network)
	for {      // wait until the database, too, considers A's lease expired
		if st, _ := store.Show(ctx, "report:42"); !st.Held() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b, _ := store.Acquire(ctx, "report:42", time.Minute)

	err := a.Publish(ctx, []byte("stale report"))
	var refused *fenced.RefusedError
	if errors.As(err, &refused) {
		fmt.Println("A refused:", refused.Cause)
	}
	fmt.Println("B publishes:", b.Publish(ctx, []byte("fresh report")) == nil)
	// Output:
	// A refused: superseded
	// B publishes: true
}
