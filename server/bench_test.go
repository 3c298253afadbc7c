package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/server"
)

// BenchmarkCycle is one acquire → publish-and-release cycle, through the library on the
// database directly and through a service on the same database (HTTP/1.1 on loopback, the
// remote driver; service-sync: with its SyncTransport, to the service's loop), so that the service's cost is read as
// a ratio in one run. -count repeats a
// sub-benchmark back to back, so the rounds are sub-benchmarks of their own
// (FENCED_BENCH_ROUNDS, default 5): within each round the two take turns at each client
// count, and a ratio compares neighbours in time:
//
//	go test -run '^$' -bench Cycle -benchtime 300x ./server
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
			// SyncConnections serves only the clients that ask for it: service-sync's.
			h := startServerWith(b, newStore(b, back.open(b)), &server.Options{Logger: slog.New(slog.DiscardHandler), SyncConnections: true}, false)
			remoteS := remoteStore(b, h, "")
			syncS, err := fenced.New(testCtx(b), syncClient(b, h.addr, ""), nil)
			if err != nil {
				b.Fatal(err)
			}
			floor := floorServer(b)
			for round := range benchRounds() {
				for _, n := range []int{1, 16, 64} {
					for _, impl := range []struct {
						name  string
						store *fenced.Store
					}{{"library", direct}, {"service", remoteS}, {"service-sync", syncS}} {
						b.Run(fmt.Sprintf("round=%d/clients=%d/impl=%s", round+1, n, impl.name), func(b *testing.B) { cycle(b, impl.store, impl.name, n) })
					}
					if n == 1 {
						b.Run(fmt.Sprintf("round=%d/clients=1/impl=http-floor", round+1), func(b *testing.B) { httpFloor(b, floor) })
					}
				}
			}
		})
	}
}

// floorServer is a loopback HTTP/1.1 server whose handler answers a lease without a database:
// the floor under the service's cost, two of its round trips per cycle.
func floorServer(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"resource":"bench","owner":"o","token":"1.1","epoch":1,"generation":1,"lease_until":"2026-01-01T00:00:00Z"}` + "\n")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/v1/resources/bench/acquire"
}

// httpFloor is floorCycle, b.N times: what the service's cycle costs beyond the library's,
// at the least.
func httpFloor(b *testing.B, url string) {
	one := floorCycle(b, url)
	b.ResetTimer()
	for range b.N {
		one()
	}
}

// benchRounds is FENCED_BENCH_ROUNDS, default 5.
func benchRounds() int {
	if n, err := strconv.Atoi(os.Getenv("FENCED_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 5
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
	// cpu-µs/cycle is this process's CPU time per cycle, every goroutine's (clients, service,
	// SQLite; not PostgreSQL's server processes): with the cores, the floor under the time
	// per cycle that any overlap of the work could reach (docs/BENCHMARKS.md, session 14).
	var cpu time.Duration
	defer func() {
		b.ReportMetric(float64(processCPU(b)-cpu)/float64(time.Microsecond)/float64(b.N), "cpu-µs/cycle")
	}()
	if clients == 1 {
		resource := fmt.Sprintf("bench %d %s", run, name)
		if err := s.Provision(ctx, resource); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		cpu = processCPU(b)
		for range b.N {
			one(resource)
		}
		return
	}
	var worker atomic.Int64
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	start := time.Now()
	cpu = processCPU(b)
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

// BenchmarkHandoverService measures the clean handover on PostgreSQL through a service and
// through the library, in one process, taking turns in each round (FENCED_BENCH_ROUNDS). The
// time is from the start of the holder's release to the grant in the waiter's hands:
//
//   - waiter=service/release=service: the waiter is a client waiting with wait_ms on a
//     connection of its own (parked by the service); the holder releases through the same
//     service, which wakes its waiter itself. The time ends when the client has read the answer.
//   - waiter=service/release=library: the holder is a store of its own on the database, as
//     another process; the service's waiter is woken by PostgreSQL's NOTIFY.
//   - waiter=library/release=library: no service: a waiter in Store.AcquireWait on a store
//     of its own, woken by NOTIFY (as BenchmarkHandover in the root package).
//   - baseline: nothing waits: the holder releases through the service and the next client's
//     acquisition is sent through the service the moment the release returns (two requests).
//
// Waiting stores poll hourly, so only the release wakes them. It reports p50 and p99:
//
//	go test -run '^$' -bench HandoverService -benchtime 200x ./server
func BenchmarkHandoverService(b *testing.B) {
	back := postgresBacking(b)
	hourly := &fenced.Config{WaitPollMin: time.Hour, WaitPollMax: time.Hour}
	open := func(cfg *fenced.Config) *fenced.Store {
		s, err := fenced.New(testCtx(b), back.open(b), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		return s
	}
	svcStore := open(hourly)
	srv, err := server.New(svcStore, &server.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	parked := make(chan struct{}, 1)
	server.SetHook(srv, func(e string) {
		if e == "parked" {
			parked <- struct{}{}
		}
	})
	h := startServerWith(b, svcStore, nil, false)
	hd := srv.Handler()
	h.handler.Store(&hd)
	viaService := remoteStore(b, h, "")
	library := open(nil)
	libraryWaiter := open(hourly)
	ctx := context.Background()
	const resource = "handover ü"
	if err := library.Provision(ctx, resource); err != nil {
		b.Fatal(err)
	}
	if _, err := library.BumpEpoch(ctx); err != nil {
		b.Fatal(err)
	}
	body := `{"ttl_ms":60000,"wait_ms":60000}`
	request := fmt.Sprintf("POST /v1/resources/handover%%20%%C3%%BC/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)

	// serviceWaiter waits through the service; ready returns once it is parked, done returns
	// its lease once its client has read the answer.
	serviceWaiter := func() (ready func(), done func() *fenced.Lease) {
		conn, err := net.Dial("tcp", h.addr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.WriteString(conn, request); err != nil {
			b.Fatal(err)
		}
		return func() { <-parked }, func() *fenced.Lease {
			defer conn.Close()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Body.Close()
			var got server.Lease
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
				b.Fatalf("the waiter: %d %v", resp.StatusCode, err)
			}
			l, err := viaService.LeaseFor(resource, got.Owner, fenced.Token{Epoch: got.Epoch, Generation: got.Generation})
			if err != nil {
				b.Fatal(err)
			}
			return l
		}
	}
	// storeWaiter waits in AcquireWait on a store of its own.
	storeWaiter := func() (ready func(), done func() *fenced.Lease) {
		waiting := make(chan struct{})
		granted := make(chan *fenced.Lease, 1)
		go func() {
			l, err := libraryWaiter.AcquireWait(ctx, resource, time.Minute, fenced.OnWaiting(func() { close(waiting) }))
			if err != nil {
				b.Error(err)
			}
			granted <- l
		}()
		return func() { <-waiting }, func() *fenced.Lease {
			l := <-granted
			if l == nil {
				b.FailNow()
			}
			return l
		}
	}
	modes := []struct {
		name    string
		holders *fenced.Store
		waiter  func() (func(), func() *fenced.Lease)
	}{
		{"baseline", viaService, nil},
		{"waiter=service/release=service", viaService, serviceWaiter},
		{"waiter=service/release=library", library, serviceWaiter},
		{"waiter=library/release=library", library, storeWaiter},
	}
	for round := range benchRounds() {
		for _, m := range modes {
			b.Run(fmt.Sprintf("round=%d/%s", round+1, m.name), func(b *testing.B) {
				gaps := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for range b.N {
					holder, err := m.holders.Acquire(ctx, resource, time.Hour)
					if err != nil {
						b.Fatal(err)
					}
					var start time.Time
					var next *fenced.Lease
					if m.waiter == nil {
						start = time.Now()
						if err := holder.Release(ctx); err != nil {
							b.Fatal(err)
						}
						if next, err = viaService.Acquire(ctx, resource, time.Minute); err != nil {
							b.Fatal(err)
						}
					} else {
						ready, done := m.waiter()
						ready()
						start = time.Now()
						if err := holder.Release(ctx); err != nil {
							b.Fatal(err)
						}
						next = done()
					}
					gaps = append(gaps, time.Since(start))
					if err := next.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				slices.Sort(gaps)
				b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(gaps[len(gaps)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
