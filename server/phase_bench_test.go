package server_test

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/server"
)

// BenchmarkCyclePhases splits the service's cycle (BenchmarkCycle, one client, PostgreSQL)
// into the layers it crosses, to find where the service's excess over the library goes. On a
// busy machine the cost of a cycle drifts from one second to the next, so the phases do not
// run one after the other: every iteration runs one cycle of each, in an order drawn afresh
// (so that no phase always follows the same one, which warms or cools the connections it
// uses). Each phase has a store, and so a pool of connections, of its own:
//
//   - library: Store.Acquire and PublishAndRelease on the database, context.Background;
//   - library-ctx: the same under contexts shaped like the service's (a cancellable request
//     context, detached and bounded by a timeout, as the server's mutationContext builds it);
//   - handler: the service's handler called in process, no network and no remote driver;
//   - inproc: a client Store and the remote driver over a transport that calls the handler in
//     process: the client's work added, the network not;
//   - service: the whole path, HTTP/1.1 on loopback (BenchmarkCycle's impl=service);
//   - http-floor: two loopback round trips to a handler with no database;
//   - sync-client, sync-server, sync-both: the service with the remote driver's SyncTransport
//     (it writes and reads on the calling goroutine), a test-only server that reads, answers
//     and writes on one goroutine per connection (no background read), or both: what
//     net/http's hand-offs between goroutines cost;
//   - sync-loop: SyncTransport to a service with Options.SyncConnections, the production form
//     of sync-both (its in-handler time counts only each connection's first request, which
//     net/http hands to the loop).
//
// Each phase reports the median of its cycles (p50-µs) and that median over the library's
// (x-library), the median time inside the service's handler (in-handler-p50-µs: the rest is
// on the way), the process's CPU time (cpu-µs, all threads) and heap allocation (B) per
// cycle (B, and allocs: objects); requests/cycle counts inproc's requests. FENCED_BENCH_PHASES (names, comma-separated)
// runs only some phases, for a profile or a trace. FENCED_BENCH_NONDURABLE=1 accepts a
// database without durable commits (synchronous_commit=off in FENCED_TEST_POSTGRES's URL), to
// take the commit's flush, which dominates on a busy disk, out of every phase alike:
//
//	go test -run '^$' -bench CyclePhases -benchtime 1000x ./server
func BenchmarkCyclePhases(b *testing.B) {
	back := postgresBacking(b)
	direct := phaseStore(b, back.open(b))
	var inprocRequests atomic.Int64
	// Every handler is timed, so that a cycle splits into the time spent in the handler and
	// the time on the way (serverSide: nanoseconds, summed over the cycle's requests).
	var serverSide atomic.Int64
	timing := func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			inner.ServeHTTP(w, r)
			serverSide.Add(int64(time.Since(start)))
		})
	}
	newHandler := func() http.Handler {
		srv, err := server.New(phaseStore(b, back.open(b)), &server.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		return timing(srv.Handler())
	}
	newListener := func(loop bool) string {
		h := startServerWith(b, phaseStore(b, back.open(b)), &server.Options{Logger: slog.New(slog.DiscardHandler), SyncConnections: loop}, false)
		timed := timing(*h.handler.Load())
		h.handler.Store(&timed)
		return h.addr
	}
	type phase struct {
		name string
		one  func() // one cycle
	}
	phases := []phase{
		{"library", storeCycle(b, direct, "library", false)},
		{"library-ctx", storeCycle(b, phaseStore(b, back.open(b)), "library-ctx", true)},
		{"handler", handlerCycle(b, newHandler(), direct)},
		{"inproc", storeCycle(b, inprocStore(b, newHandler(), &inprocRequests), "inproc", false)},
		{"service", storeCycle(b, phaseStore(b, client(b, newListener(false), "")), "service", false)},
		{"http-floor", floorCycle(b, floorServer(b))},
		{"sync-client", storeCycle(b, syncClientStore(b, newListener(false)), "sync-client", false)},
		{"sync-server", storeCycle(b, phaseStore(b, client(b, syncServer(b, newHandler()), "")), "sync-server", false)},
		{"sync-both", storeCycle(b, syncClientStore(b, syncServer(b, newHandler())), "sync-both", false)},
		{"sync-loop", storeCycle(b, syncClientStore(b, newListener(true)), "sync-loop", false)},
	}
	if only := os.Getenv("FENCED_BENCH_PHASES"); only != "" {
		phases = slices.DeleteFunc(phases, func(p phase) bool { return !slices.Contains(strings.Split(only, ","), p.name) })
	}
	took := make([][]time.Duration, len(phases))
	inHandler := make([][]time.Duration, len(phases)) // the handlers' time, per cycle
	cpu := make([]time.Duration, len(phases))         // the process's CPU time, summed
	allocs := make([]uint64, len(phases))             // bytes allocated, summed
	objects := make([]uint64, len(phases))            // heap allocations, summed
	inprocRequests.Store(0)
	order := rand.New(rand.NewPCG(1, 2))
	b.ResetTimer()
	for range b.N {
		for _, k := range order.Perm(len(phases)) {
			before, cpuBefore := serverSide.Load(), processCPU(b)
			allocBefore, objBefore := allocated()
			start := time.Now()
			phases[k].one()
			took[k] = append(took[k], time.Since(start))
			cpu[k] += processCPU(b) - cpuBefore
			alloc, obj := allocated()
			allocs[k] += alloc - allocBefore
			objects[k] += obj - objBefore
			inHandler[k] = append(inHandler[k], time.Duration(serverSide.Load()-before))
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	var lib time.Duration
	if phases[0].name == "library" {
		lib = median(took[0])
	}
	for k, p := range phases {
		m := median(took[k])
		b.ReportMetric(float64(m.Microseconds()), p.name+"-p50-µs")
		if lib > 0 {
			b.ReportMetric(float64(m)/float64(lib), p.name+"-x-library")
		}
		if h := median(inHandler[k]); h > 0 {
			b.ReportMetric(float64(h.Microseconds()), p.name+"-in-handler-p50-µs")
		}
		b.ReportMetric(float64(cpu[k].Microseconds())/float64(b.N), p.name+"-cpu-µs")
		b.ReportMetric(float64(allocs[k])/float64(b.N), p.name+"-B")
		b.ReportMetric(float64(objects[k])/float64(b.N), p.name+"-allocs")
	}
	b.ReportMetric(float64(inprocRequests.Load())/float64(b.N), "requests/cycle")
}

// storeCycle returns one acquire → publish-and-release cycle through s on a resource of its
// own; with requestCtx, each operation runs under a context shaped like the service's.
func storeCycle(b *testing.B, s *fenced.Store, name string, requestCtx bool) func() {
	resource := fmt.Sprintf("bench %d %s", benchRun.Add(1), name)
	if err := s.Provision(context.Background(), resource); err != nil {
		b.Fatal(err)
	}
	op := func(f func(ctx context.Context) error) {
		ctx := context.Background()
		if requestCtx {
			req, cancelReq := context.WithCancel(ctx)
			defer cancelReq()
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(req), server.DefaultMutationTimeout)
			defer cancel()
		}
		if err := f(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return func() {
		var l *fenced.Lease
		op(func(ctx context.Context) (err error) { l, err = s.Acquire(ctx, resource, time.Minute); return err })
		op(func(ctx context.Context) error { return l.PublishAndRelease(ctx, []byte("payload\x00")) })
	}
}

// floorCycle returns one cycle's two HTTP round trips (the remote driver's transport
// settings) to floorServer.
func floorCycle(b *testing.B, url string) func() {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = tr.MaxIdleConns
	b.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	req := []byte(`{"ttl_ms":60000,"owner":"o"}`)
	return func() {
		for range 2 {
			resp, err := c.Post(url, "application/json", bytes.NewReader(req))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}
}

// handlerCycle drives the service's handler in process: the acquisition and the
// publish-and-release requests the remote driver would send, answered into recorders.
func handlerCycle(b *testing.B, handler http.Handler, s *fenced.Store) func() {
	resource := fmt.Sprintf("bench %d handler", benchRun.Add(1))
	if err := s.Provision(context.Background(), resource); err != nil {
		b.Fatal(err)
	}
	path := "/v1/resources/" + url.PathEscape(resource)
	// Not httptest.NewRequest: it parses a request line through a bufio.Reader of 4 KB, which
	// the handler's allocation per cycle would be charged with.
	serve := func(op, body string, header http.Header) *httptest.ResponseRecorder {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, path+"/"+op, strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		r.Header, r.RemoteAddr, r.Host = header, "127.0.0.1:40000", "127.0.0.1:7070"
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, r)
		return rec
	}
	return func() {
		rec := serve("acquire", `{"ttl_ms":60000,"owner":"bench-owner"}`, http.Header{"Content-Type": {"application/json"}})
		if rec.Code != http.StatusOK {
			b.Fatalf("acquire: %d %s", rec.Code, rec.Body)
		}
		var l server.Lease
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
			b.Fatal(err)
		}
		h := http.Header{"Content-Type": {"application/octet-stream"}}
		h.Set(server.HeaderOwner, l.Owner)
		h.Set(server.HeaderToken, l.Token)
		h.Set(server.HeaderOpID, crand.Text())
		if rec := serve("publish-and-release", "payload\x00", h); rec.Code != http.StatusOK {
			b.Fatalf("publish and release: %d %s", rec.Code, rec.Body)
		}
	}
}

// inprocStore is a client Store whose remote driver's transport calls handler in process.
func inprocStore(b *testing.B, handler http.Handler, requests *atomic.Int64) *fenced.Store {
	d, err := remote.Open("http://inproc", &remote.Options{Client: &http.Client{Transport: inprocTransport{handler, requests}}})
	if err != nil {
		b.Fatal(err)
	}
	return phaseStore(b, d)
}

// phaseStore opens a store for BenchmarkCyclePhases (FENCED_BENCH_NONDURABLE: see there).
func phaseStore(b *testing.B, drv driver.Driver) *fenced.Store {
	s, err := fenced.New(testCtx(b), drv, &fenced.Config{MaxPayloadBytes: 1 << 20, AllowNonDurable: os.Getenv("FENCED_BENCH_NONDURABLE") == "1"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// inprocTransport answers a request by calling a handler, as if from loopback.
type inprocTransport struct {
	handler  http.Handler
	requests *atomic.Int64
}

func (t inprocTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.requests.Add(1)
	r = r.Clone(r.Context())
	r.RemoteAddr, r.Host = "127.0.0.1:40000", "127.0.0.1:7070"
	r.RequestURI = r.URL.RequestURI()
	rec := httptest.NewRecorder()
	t.handler.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// syncClientStore is a client Store whose remote driver has remote.Options.SyncTransport:
// each request is sent and its answer read on the calling goroutine.
func syncClientStore(b *testing.B, addr string) *fenced.Store {
	return phaseStore(b, clientWith(b, addr, &remote.Options{SyncTransport: true}))
}

// syncServer serves handler on a loopback listener with one goroutine per connection that
// reads a request, answers it and writes the answer: net/http's server without its
// background read. For measurement only.
func syncServer(b *testing.B, handler http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	b.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					req.RemoteAddr = c.RemoteAddr().String()
					rec := httptest.NewRecorder()
					handler.ServeHTTP(rec, req)
					_, _ = io.Copy(io.Discard, req.Body)
					resp := rec.Result()
					resp.ContentLength = int64(rec.Body.Len())
					if resp.Write(bw) != nil || bw.Flush() != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// allocated is the bytes the process has allocated on the heap so far.
func allocated() (bytes, objects uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}
