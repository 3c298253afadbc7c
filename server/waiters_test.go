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
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/server"
)

// childEnv makes the test binary a service over the SQLite file it names (serveChild), so
// that the service's memory can be measured in a process of its own.
const childEnv = "FENCED_TEST_SERVE_CHILD"

func init() {
	if path := os.Getenv(childEnv); path != "" {
		serveChild(path)
	}
}

// serveChild serves the store at path on a free loopback port, prints the address, and exits
// when stdin closes. GET /test/memory collects garbage and answers the runtime's memory
// figures, so that the parent reads live memory, not garbage not yet collected.
func serveChild(path string) {
	fail := func(err error) { fmt.Fprintln(os.Stderr, "serve child:", err); os.Exit(1) }
	d, err := sqlite.Open(path)
	if err != nil {
		fail(err)
	}
	store, err := fenced.New(context.Background(), d, nil)
	if err != nil {
		fail(err)
	}
	srv, err := server.New(store, &server.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fail(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", srv.Handler())
	mux.HandleFunc("GET /test/memory", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		if f := os.Getenv("FENCED_TEST_HEAPPROFILE"); f != "" { // for go tool pprof
			if out, err := os.Create(f); err == nil {
				_ = pprof.WriteHeapProfile(out)
				_ = out.Close()
			}
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		_ = json.NewEncoder(w).Encode(map[string]uint64{"heap_inuse": m.HeapInuse, "stack_inuse": m.StackInuse,
			"goroutines": uint64(runtime.NumGoroutine())})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	fmt.Println(ln.Addr().String())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); os.Exit(0) }()
	fail((&http.Server{Handler: mux}).Serve(ln))
}

// TestMemoryPerWaiter (FENCED_BENCH_WAITERS=N, default off; N waiters, e.g. 10000) measures
// what a waiting client costs the service: a service in a child process over SQLite, a
// resource held, then N real HTTP/1.1 connections each sending one acquisition with wait_ms
// of a minute. Once the service's fenced_waiters gauge says all N wait, it compares the
// child's live heap and goroutine stacks (after a GC) and its resident set (VmRSS) with the
// figures before the first waiter. Kernel socket buffers are not counted.
func TestMemoryPerWaiter(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FENCED_BENCH_WAITERS"))
	if n <= 0 {
		t.Skip("set FENCED_BENCH_WAITERS=10000 to measure the memory of that many waiting clients")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "fenced.db")
	d, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	setup, err := fenced.New(testCtx(t), d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	const resource = "waited on ü"
	if err := setup.Provision(testCtx(t), resource); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Acquire(testCtx(t), resource, time.Hour); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait(); http.DefaultClient.CloseIdleConnections() }()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr = strings.TrimSpace(addr)

	type memory struct{ heap, stack, rss, goroutines uint64 }
	measure := func() memory {
		resp, err := http.Get("http://" + addr + "/test/memory")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]uint64
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		var rss uint64
		for line := range strings.Lines(string(status)) {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				rss = kb << 10
			}
		}
		return memory{m["heap_inuse"], m["stack_inuse"], rss, m["goroutines"]}
	}
	waiting := func() int {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "fenced_waiters "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				return int(f)
			}
		}
		t.Fatalf("no fenced_waiters in /metrics")
		return 0
	}
	// Warm the service up (one busy answer, one scrape) before the baseline.
	if w := waiting(); w != 0 {
		t.Fatalf("%d waiters before the first", w)
	}
	before := measure()

	body := `{"ttl_ms":60000,"wait_ms":60000}`
	req := fmt.Sprintf("POST /v1/resources/%s/acquire HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		strings.ReplaceAll(resource, " ", "%20"), addr, len(body), body)
	req = strings.Replace(req, "ü", "%C3%BC", 1)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial waiter %d: %v", len(conns)+1, err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
	}
	// Barrier: the service's own gauge, not a sleep.
	deadline := time.Now().Add(2 * time.Minute)
	for w := waiting(); w < n; w = waiting() {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d waiters are waiting", w, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := measure()
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) / 1024 }
	t.Logf("%d waiters: live heap %.1f KiB each, goroutine stacks %.1f KiB each, heap+stacks %.1f KiB each, RSS %.1f KiB each (goroutines %d -> %d; RSS %d -> %d MiB)",
		n, per(after.heap, before.heap), per(after.stack, before.stack), per(after.heap+after.stack, before.heap+before.stack),
		per(after.rss, before.rss), before.goroutines, after.goroutines, before.rss>>20, after.rss>>20)
	// A measurement, not a check: docs/SERVICE.md reports it against the target (under
	// 16 KiB per waiting client).
}
