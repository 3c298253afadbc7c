package server_test

import (
	"context"
	"fmt"
	"log/slog"
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
// "parallel" runs GOMAXPROCS×8 clients at once, each on a resource of its own.
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
				b.Run("impl="+impl.name, func(b *testing.B) { cycle(b, impl.store, impl.name, false) })
				b.Run("impl="+impl.name+"/parallel", func(b *testing.B) { cycle(b, impl.store, impl.name, true) })
			}
		})
	}
}

var benchRun atomic.Int64

func cycle(b *testing.B, s *fenced.Store, name string, parallel bool) {
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
	if !parallel {
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
	b.SetParallelism(8)
	b.ResetTimer()
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
