package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/server"
)

// BenchmarkCycle is one acquire → publish-and-release cycle, through the library on the
// database directly and through a service on the same database (HTTP/1.1 on loopback, the
// remote driver), so that the service's cost is read as a ratio in one run:
//
//	go test -run '^$' -bench Cycle -count 6 ./server | benchstat -col /impl -
//
// "clients=N" runs N clients at once (goroutines, each on a resource of its own; through the
// service they share the remote driver's keep-alive connections), and reports cycles/s.
func BenchmarkCycle(b *testing.B) {
	for _, db := range []string{"postgres", "sqlite"} {
		b.Run("db="+db, func(b *testing.B) {
			var back backing
			if db == "postgres" {
				back = postgresBacking(b)
			} else {
				back = sqliteBacking(b)
			}
			direct := newStore(b, back.open(b))
			h := startServerWith(b, newStore(b, back.open(b)), &server.Options{Logger: slog.New(slog.DiscardHandler)}, false)
			remoteS := remoteStore(b, h, "")
			for _, impl := range []struct {
				name  string
				store *fenced.Store
			}{{"library", direct}, {"service", remoteS}} {
				b.Run("impl="+impl.name, func(b *testing.B) { cycle(b, impl.store, impl.name, 1) })
				for _, n := range []int{16, 64} {
					b.Run(fmt.Sprintf("impl=%s/clients=%d", impl.name, n), func(b *testing.B) { cycle(b, impl.store, impl.name, n) })
				}
			}
		})
	}
}

var benchRun atomic.Int64

func cycle(b *testing.B, s *fenced.Store, name string, clients int) {
	ctx := context.Background()
	run := benchRun.Add(1)
	one := func(resource string) {
		l, err := s.Acquire(ctx, resource, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.PublishAndRelease(ctx, []byte("payload\x00")); err != nil {
			b.Fatal(err)
		}
	}
	if clients == 1 {
		resource := fmt.Sprintf("bench %d %s", run, name)
		if err := s.Provision(ctx, resource); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			one(resource)
		}
		return
	}
	var worker atomic.Int64
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	start := time.Now()
	defer func() { b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s") }()
	b.RunParallel(func(pb *testing.PB) {
		resource := fmt.Sprintf("bench %d %s %d", run, name, worker.Add(1))
		if err := s.Provision(ctx, resource); err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			one(resource)
		}
	})
}
