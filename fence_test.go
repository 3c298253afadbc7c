package fenced_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
	_ "modernc.org/sqlite"
)

const fenceResource = "rapport nº 7; ü"

// fenceWorld is a lease store and a participating service (a gate on its own SQLite database,
// behind HTTP), with the resource provisioned in both and the epoch bumped so that epoch and
// generation differ.
type fenceWorld struct {
	store  *fenced.Store
	admin  *sql.DB // the lease store's database, to expire a lease on its clock
	gate   *gate.Gate
	srv    *httptest.Server
	writes chan string // bodies the service committed
}

func newFenceWorld(t *testing.T) *fenceWorld {
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
	if err := store.Provision(ctx, fenceResource); err != nil {
		t.Fatal(err)
	}
	for range 2 { // epoch 3: generations 1 and 2 never equal it
		if _, err := store.BumpEpoch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "service.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	g, err := gate.New(db, gate.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(ctx, fenceResource); err != nil {
		t.Fatal(err)
	}
	w := &fenceWorld{store: store, admin: drv.DB(), gate: g, writes: make(chan string, 10)}
	w.srv = httptest.NewServer(g.Handler(func(rw http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		w.writes <- string(b) // the write itself would go in tx here
		return nil
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// send writes body to the service as the lease's holder, through destination.Transport.
func (w *fenceWorld) send(t *testing.T, l *fenced.Lease, body string) int {
	t.Helper()
	c := &http.Client{Transport: &destination.Transport{Holder: l}}
	resp, err := c.Post(w.srv.URL, "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// expire ends the current lease on the lease store's clock, as if its TTL had run out while
// the holder was paused.
func (w *fenceWorld) expire(t *testing.T) {
	t.Helper()
	_, err := w.admin.Exec(`UPDATE fenced_resources SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
		WHERE resource = ? AND lease_until IS NOT NULL`, fenceResource)
	if err != nil {
		t.Fatal(err)
	}
}

// The article's paused-writer schedule through fenced.Run, forced with channels: A writes, is
// paused, its lease expires and B acquires; then A's delayed write arrives before B writes.
// Without fencing on acquisition the gate accepts it (the gap is real); with B fencing the
// gate on acquisition it is refused with 409 and the mark is B's.
func TestFenceOnAcquisitionClosesTheGap(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := map[bool]string{false: "WithoutFence", true: "WithFence"}[fence]
		t.Run(name, func(t *testing.T) {
			w := newFenceWorld(t)
			ctx := context.Background()
			var opts fenced.RunOptions
			opts.TTL = time.Minute
			if fence {
				opts.Fence = []fenced.Fencer{w.gate}
			}
			aPaused, aResume, aDone := make(chan *fenced.Lease), make(chan struct{}), make(chan int)
			go func() {
				_, _ = fenced.Run(ctx, w.store, fenceResource, &opts, func(_ context.Context, l *fenced.Lease) ([]byte, error) {
					if code := w.send(t, l, "A first"); code != http.StatusNoContent {
						t.Errorf("A's first write: %d", code)
					}
					aPaused <- l
					<-aResume // paused: a GC pause, SIGSTOP, a slow network
					aDone <- w.send(t, l, "A delayed")
					return nil, nil
				})
			}()
			a := <-aPaused
			<-w.writes
			w.expire(t)
			bAcquired, bWrite := make(chan *fenced.Lease), make(chan struct{})
			bRes := make(chan error, 1)
			go func() {
				_, err := fenced.Run(ctx, w.store, fenceResource, &opts, func(_ context.Context, l *fenced.Lease) ([]byte, error) {
					bAcquired <- l
					<-bWrite
					if code := w.send(t, l, "B"); code != http.StatusNoContent {
						t.Errorf("B's write: %d", code)
					}
					return []byte("B"), nil
				})
				bRes <- err
			}()
			b := <-bAcquired
			if a.Token().Compare(b.Token()) >= 0 || b.Epoch() == b.Generation() {
				t.Fatalf("tokens A %s, B %s", a.Token(), b.Token())
			}
			close(aResume)
			code := <-aDone
			mark, err := w.gate.Mark(ctx, fenceResource)
			if err != nil {
				t.Fatal(err)
			}
			if fence {
				if code != http.StatusConflict || mark != b.Token() {
					t.Errorf("with fencing on acquisition A's delayed write got %d, mark %s; want 409 and B's %s", code, mark, b.Token())
				}
			} else {
				if code != http.StatusNoContent || mark != a.Token() {
					t.Errorf("without fencing A's delayed write got %d, mark %s; want it accepted under A's %s (the gap)", code, mark, a.Token())
				}
				if got := <-w.writes; got != "A delayed" {
					t.Errorf("service committed %q", got)
				}
			}
			close(bWrite)
			if err := <-bRes; err != nil {
				t.Fatal(err)
			}
			if got := <-w.writes; got != "B" {
				t.Errorf("service committed %q, want B", got)
			}
			select {
			case got := <-w.writes:
				t.Errorf("unexpected committed write %q", got)
			default:
			}
		})
	}
}

type failingFencer struct{ err error }

func (f failingFencer) Fence(context.Context, string, fenced.Token) error { return f.err }

// A destination that cannot be fenced stops the work before it starts, and the lease is
// released so the next holder need not wait for its expiry.
func TestRunStopsWhenAFenceFails(t *testing.T) {
	w := newFenceWorld(t)
	ctx := context.Background()
	unknown, err := gate.New(w.gateDB(t), gate.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    fenced.Fencer
		want error
	}{
		{"unknown resource", unknown, destination.ErrUnknownResource},
		{"unreachable", failingFencer{errors.New("connection refused")}, nil},
		{"nil", nil, fenced.ErrInvalid},
	} {
		ran := false
		_, err := fenced.Run(ctx, w.store, fenceResource, &fenced.RunOptions{Fence: []fenced.Fencer{w.gate, c.f}},
			func(context.Context, *fenced.Lease) ([]byte, error) { ran = true; return nil, nil })
		if ran {
			t.Errorf("%s: build ran", c.name)
		}
		if c.want == fenced.ErrInvalid {
			if !errors.Is(err, fenced.ErrInvalid) {
				t.Errorf("%s: %v", c.name, err)
			}
		} else if !errors.Is(err, fenced.ErrNotFenced) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want ErrNotFenced and %v", c.name, err, c.want)
		}
		var fe *fenced.FenceError
		if errors.As(err, &fe) && (fe.Index != 1 || !strings.Contains(err.Error(), "at destination #2: ")) {
			t.Errorf("%s: index %d in %q; want the second destination", c.name, fe.Index, err)
		}
		if st, err := w.store.Show(ctx, fenceResource); err != nil || st.Held() {
			t.Errorf("%s: the lease was not released: %+v %v", c.name, st, err)
		}
	}
}

// gateDB is an empty service database with a migrated gate and no resources.
func (w *fenceWorld) gateDB(t *testing.T) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "empty.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	g, _ := gate.New(db, gate.SQLite, nil)
	if err := g.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db
}

// Lease.Fence by a superseded holder is refused: the destination already has the newer token.
func TestLeaseFenceSuperseded(t *testing.T) {
	w := newFenceWorld(t)
	ctx := context.Background()
	a, err := w.store.Acquire(ctx, fenceResource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w.expire(t)
	b, err := w.store.Acquire(ctx, fenceResource, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Fence(ctx, w.gate); err != nil {
		t.Fatal(err)
	}
	err = a.Fence(ctx, w.gate)
	var stale *destination.StaleError
	if !errors.Is(err, fenced.ErrNotFenced) || !errors.As(err, &stale) || stale.Current != b.Token() {
		t.Fatalf("A's late fence: %v", err)
	}
	if !strings.Contains(err.Error(), fenceResource) {
		t.Errorf("the error does not name the resource: %v", err)
	}
}

// ownerRecorder is an OwnerFencer that records what it was given; its plain Fence must not
// be called.
type ownerRecorder struct {
	resource, owner string
	token           fenced.Token
}

func (o *ownerRecorder) Fence(context.Context, string, fenced.Token) error {
	return errors.New("Fence called on an OwnerFencer")
}

func (o *ownerRecorder) FenceOwner(_ context.Context, resource, owner string, token fenced.Token) error {
	o.resource, o.owner, o.token = resource, owner, token
	return nil
}

// Lease.Fence gives an OwnerFencer the acquisition's owner, and Run does the same.
func TestFenceGivesTheOwner(t *testing.T) {
	w := newFenceWorld(t)
	ctx := context.Background()
	rec := &ownerRecorder{}
	var lease *fenced.Lease
	if _, err := fenced.Run(ctx, w.store, fenceResource, &fenced.RunOptions{Fence: []fenced.Fencer{rec}},
		func(_ context.Context, l *fenced.Lease) ([]byte, error) { lease = l; return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if rec.resource != fenceResource || rec.owner != lease.Owner() || rec.token != lease.Token() || rec.owner == "" {
		t.Fatalf("FenceOwner got (%q, %q, %s), want (%q, %q, %s)", rec.resource, rec.owner, rec.token,
			fenceResource, lease.Owner(), lease.Token())
	}
}
