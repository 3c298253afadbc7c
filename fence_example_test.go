package fenced_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination/gate"
)

// Run fences the named destinations right after acquiring, before build starts: from then on
// they refuse the previous holder's writes, whatever this holder has written.
func ExampleRunOptions_fence() {
	dir, _ := os.MkdirTemp("", "fenced-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	drv, _ := sqlite.Open(filepath.Join(dir, "fenced.db"))
	store, _ := fenced.New(ctx, drv, nil)
	defer store.Close()
	_ = store.Provision(ctx, "report:42")

	// A participating service's gate (here in-process; over HTTP use destination.Remote).
	db, _ := sql.Open("sqlite", filepath.Join(dir, "service.db"))
	defer db.Close()
	svc, _ := gate.New(db, gate.SQLite, nil)
	_ = svc.Migrate(ctx)
	_ = svc.Add(ctx, "report:42")

	_, err := fenced.Run(ctx, store, "report:42", &fenced.RunOptions{TTL: 30 * time.Second, Fence: []fenced.Fencer{svc}},
		func(ctx context.Context, lease *fenced.Lease) ([]byte, error) {
			mark, _ := svc.Mark(ctx, "report:42")
			fmt.Println("the service's mark is the lease's token:", mark == lease.Token())
			return []byte("done"), nil
		})
	fmt.Println("run:", err)
	// Output:
	// the service's mark is the lease's token: true
	// run: <nil>
}
