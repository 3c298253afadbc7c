package drivertest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Raw runs each protocol statement directly on the engine, as hand-written application code
// would: the baseline that fenced's operations are measured against in the same run. Each
// method is the single conditional statement and nothing else.
type Raw interface {
	// Acquire runs the conditional acquisition; ok is false when the lease was not free.
	Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (g driver.Grant, ok bool, err error)
	// Publish runs the conditional publication and records its operation id, as the driver's
	// statement or transaction does.
	Publish(ctx context.Context, lease driver.LeaseRef, pub driver.Publication) (bool, error)
	PublishAndRelease(ctx context.Context, lease driver.LeaseRef, pub driver.Publication) (bool, error)
	Release(ctx context.Context, lease driver.LeaseRef) (bool, error)
}

// BenchTarget is the store a backend's benchmarks run on.
type BenchTarget struct {
	// Open returns a driver whose pool serves 16 concurrent goroutines.
	Open func(b *testing.B) driver.Driver
	// Raw returns the baseline on the same database, with a pool of the same size.
	Raw func(b *testing.B) Raw
	// AllowNonDurable opens the store with fenced.Config.AllowNonDurable (see Target).
	AllowNonDurable bool
}

const benchTTL = time.Minute

// Bench runs the benchmark matrix: the acquire-publish-release cycle ("Cycle") and the
// acquire-PublishAndRelease cycle ("PublishAndRelease"); on one goroutine (g1), on 16 goroutines
// with a resource each (g16) and on 16 goroutines sharing one hot resource (g16-hot); each
// once through fenced (impl=fenced) and once through the raw statements (impl=raw), so that
// `benchstat -col /impl` shows the ratio. Each operation's mean latency is its own metric:
// acquire-ns/op (granted), busy-ns/op (an acquisition refused as busy), publish-ns/op,
// release-ns/op, publish-release-ns/op; busy/acquire is the share of acquisitions that found
// the lease held. On the hot resource ns/op mixes busy and granted iterations, so compare the
// per-operation metrics there.
func Bench(b *testing.B, target BenchTarget) {
	store, err := fenced.New(context.Background(), target.Open(b), &fenced.Config{AllowNonDurable: target.AllowNonDurable})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	impls := []struct {
		name string
		impl impl
	}{
		{"fenced", fencedImpl{store}},
		{"raw", rawImpl{target.Raw(b)}},
	}
	for _, cycle := range []string{"Cycle", "PublishAndRelease"} {
		for _, shape := range []struct {
			name    string
			workers int
			hot     bool
		}{{"g1", 1, false}, {"g16", 16, false}, {"g16-hot", 16, true}} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("%s/%s/impl=%s", cycle, shape.name, im.name), func(b *testing.B) {
					runCycle(b, store, im.impl, cycle == "PublishAndRelease", shape.workers, shape.hot)
				})
			}
		}
	}
}

// impl is what a benchmark drives: fenced's API or the raw statements.
type impl interface {
	acquire(ctx context.Context, resource string) (h handle, ok bool, err error)
}

type handle interface {
	publish(ctx context.Context, p []byte) error
	publishAndRelease(ctx context.Context, p []byte) error
	release(ctx context.Context) error
}

var benchRun atomic.Int64

func runCycle(b *testing.B, store *fenced.Store, im impl, combined bool, workers int, hot bool) {
	ctx := context.Background()
	payload := make([]byte, 1024)
	_, _ = rand.Read(payload)
	prefix := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), benchRun.Add(1))
	var next atomic.Int64
	newResource := func() string {
		name := prefix + "-hot"
		if !hot {
			name = fmt.Sprintf("%s-%d", prefix, next.Add(1))
		}
		if err := store.Provision(ctx, name); err != nil {
			b.Fatal(err)
		}
		return name
	}
	var acquireNs, busyNs, publishNs, releaseNs, acquires, busy, cycles atomic.Int64
	timed := func(sum *atomic.Int64, f func() error) error {
		start := time.Now()
		err := f()
		sum.Add(int64(time.Since(start)))
		return err
	}
	loop := func(more func() bool, resource string) {
		for more() {
			var (
				h   handle
				ok  bool
				err error
			)
			start := time.Now()
			h, ok, err = im.acquire(ctx, resource)
			took := int64(time.Since(start))
			acquires.Add(1)
			if err != nil {
				b.Error(err)
				return
			}
			if !ok {
				busy.Add(1)
				busyNs.Add(took)
				continue
			}
			acquireNs.Add(took)
			if combined {
				err = timed(&publishNs, func() error { return h.publishAndRelease(ctx, payload) })
			} else {
				err = timed(&publishNs, func() error { return h.publish(ctx, payload) })
				if err == nil {
					err = timed(&releaseNs, func() error { return h.release(ctx) })
				}
			}
			if err != nil {
				b.Error(err)
				return
			}
			cycles.Add(1)
		}
	}

	b.ReportAllocs()
	if workers == 1 {
		r := newResource()
		b.ResetTimer()
		i := 0
		loop(func() bool { i++; return i <= b.N }, r)
	} else {
		if hot {
			newResource()
		}
		procs := runtime.GOMAXPROCS(0)
		b.SetParallelism((workers + procs - 1) / procs)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			loop(pb.Next, newResource())
		})
	}
	b.StopTimer()
	if n := acquires.Load(); n > 0 {
		b.ReportMetric(float64(busy.Load())/float64(n), "busy/acquire")
	}
	if n := acquires.Load() - busy.Load(); n > 0 {
		b.ReportMetric(float64(acquireNs.Load())/float64(n), "acquire-ns/op")
	}
	if n := busy.Load(); n > 0 {
		b.ReportMetric(float64(busyNs.Load())/float64(n), "busy-ns/op")
	}
	if n := cycles.Load(); n > 0 {
		if combined {
			b.ReportMetric(float64(publishNs.Load())/float64(n), "publish-release-ns/op")
		} else {
			b.ReportMetric(float64(publishNs.Load())/float64(n), "publish-ns/op")
			b.ReportMetric(float64(releaseNs.Load())/float64(n), "release-ns/op")
		}
	}
}

type fencedImpl struct{ store *fenced.Store }

func (f fencedImpl) acquire(ctx context.Context, resource string) (handle, bool, error) {
	l, err := f.store.Acquire(ctx, resource, benchTTL)
	if errors.Is(err, fenced.ErrBusy) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return fencedHandle{l}, true, nil
}

type fencedHandle struct{ l *fenced.Lease }

func (h fencedHandle) publish(ctx context.Context, p []byte) error { return h.l.Publish(ctx, p) }
func (h fencedHandle) publishAndRelease(ctx context.Context, p []byte) error {
	return h.l.PublishAndRelease(ctx, p)
}
func (h fencedHandle) release(ctx context.Context) error { return h.l.Release(ctx) }

type rawImpl struct{ raw Raw }

func (r rawImpl) acquire(ctx context.Context, resource string) (handle, bool, error) {
	owner := rand.Text() // an application would make a fresh owner too
	g, ok, err := r.raw.Acquire(ctx, resource, owner, benchTTL)
	if err != nil || !ok {
		return nil, ok, err
	}
	return rawHandle{r.raw, driver.LeaseRef{Resource: resource, Owner: owner, Epoch: g.Epoch, Generation: g.Generation}}, true, nil
}

type rawHandle struct {
	raw Raw
	ref driver.LeaseRef
}

var errRawRefused = errors.New("raw statement matched no row")

func rawResult(ok bool, err error) error {
	if err == nil && !ok {
		return errRawRefused
	}
	return err
}

func (h rawHandle) publish(ctx context.Context, p []byte) error {
	return rawResult(h.raw.Publish(ctx, h.ref, driver.Publication{Payload: p, OpID: rand.Text()}))
}
func (h rawHandle) publishAndRelease(ctx context.Context, p []byte) error {
	return rawResult(h.raw.PublishAndRelease(ctx, h.ref, driver.Publication{Payload: p, OpID: rand.Text()}))
}
func (h rawHandle) release(ctx context.Context) error {
	return rawResult(h.raw.Release(ctx, h.ref))
}
