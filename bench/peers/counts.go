package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

var (
	etcdRaw      = flag.Bool("etcd-raw", false, "also run the bare Txn shapes of -etcd-counts through the workloads (without the stale and crash trials): the least that fenced's etcd semantics write beside what the Mutex writes")
	etcdCounts   = flag.Bool("etcd-counts", false, "instead of the workloads, run 16 clients on 16 resources for -d on each etcd system and print, per acquire+release pair, the etcd requests it sent by kind (client side) and what the embedded member did: Raft proposals, WAL fsyncs and bytes, MVCC puts, deletes and ranges, lease grants, revocations and renewals")
	countClients = flag.Int("counts-clients", 16, "clients (each on its own resource) for -etcd-counts; with FENCED_BENCH_ETCD set the member runs in another process, and the CPU time and allocations counted are the clients' alone")
)

// rpcCounter counts the client's gRPC calls by method, the streams it opens and the
// messages it sends on them.
type rpcCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

var rpcs = &rpcCounter{n: map[string]int64{}}

func (c *rpcCounter) add(kind string) {
	c.mu.Lock()
	c.n[kind]++
	c.mu.Unlock()
}

func (c *rpcCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := make(map[string]int64, len(c.n))
	for k, v := range c.n {
		s[k] = v
	}
	return s
}

// dialOptions install the counting interceptors.
func (c *rpcCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.add(short(method))
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.add(short(method) + " stream opened")
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return countedStream{s, c, short(method) + " message"}, nil
		}),
	}
}

type countedStream struct {
	grpc.ClientStream
	c    *rpcCounter
	kind string
}

func (s countedStream) SendMsg(m any) error {
	s.c.add(s.kind)
	return s.ClientStream.SendMsg(m)
}

// short is a gRPC method without its service: "/etcdserverpb.KV/Txn" is "Txn".
func short(method string) string { return method[strings.LastIndex(method, "/")+1:] }

// serverMetrics are the embedded member's counters that tell what a pair cost the cluster,
// with the metric each sums (a histogram's count).
var serverMetrics = []struct{ label, metric string }{
	{"Raft proposals committed", "etcd_server_proposals_committed_total"},
	{"WAL fsyncs", "etcd_disk_wal_fsync_duration_seconds"},
	{"WAL bytes", "etcd_disk_wal_write_bytes_total"},
	{"backend commits", "etcd_disk_backend_commit_duration_seconds"},
	{"MVCC puts", "etcd_mvcc_put_total"},
	{"MVCC deletes", "etcd_mvcc_delete_total"},
	{"MVCC ranges", "etcd_mvcc_range_total"},
	{"MVCC txns", "etcd_mvcc_txn_total"},
	{"leases granted", "etcd_debugging_lease_granted_total"},
	{"leases revoked", "etcd_debugging_lease_revoked_total"},
	{"leases renewed", "etcd_debugging_lease_renewed_total"},
}

// gatherServer reads serverMetrics from this process's registry, where the embedded member
// registers them.
func gatherServer() (map[string]float64, error) {
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			out[f.GetName()] += v
		}
	}
	return out, nil
}

// countEtcd runs the g16 workload on each etcd system in turn and prints what one pair cost.
// Between systems it waits for fenced's background work (the tender of leases granted ahead
// stops two seconds after the last acquisition) so that it is not counted for the next.
func countEtcd(ctx context.Context, systems []system) error {
	type column struct {
		name  string
		pairs int
		rpc   map[string]int64
		srv   map[string]float64
		cpu   time.Duration // the process's: the clients, the driver and the embedded member
		// mallocs are the process's heap allocations, like cpu
		mallocs uint64
	}
	var cols []column
	for _, s := range systems {
		if s.server != "etcd" {
			continue
		}
		fmt.Fprintf(os.Stderr, "counting: %s\n", s.name)
		if _, _, err := loop(ctx, s, *countClients, nil); err != nil { // warm: provisioned, pools filled
			return err
		}
		time.Sleep(3 * time.Second)
		rpc0, srv0, cpu0, mallocs0 := rpcs.snapshot(), must(gatherServer()), cpuTime(), mallocs()
		_, n, err := loop(ctx, s, *countClients, nil)
		if err != nil {
			return err
		}
		time.Sleep(3 * time.Second) // the tender's last keepalives and grants are this system's
		rpc1, srv1, cpu1, mallocs1 := rpcs.snapshot(), must(gatherServer()), cpuTime(), mallocs()
		c := column{name: s.name, pairs: n, rpc: map[string]int64{}, srv: map[string]float64{}, cpu: cpu1 - cpu0, mallocs: mallocs1 - mallocs0}
		for k, v := range rpc1 {
			c.rpc[k] = v - rpc0[k]
		}
		for _, m := range serverMetrics {
			c.srv[m.metric] = srv1[m.metric] - srv0[m.metric]
		}
		cols = append(cols, c)
	}
	kinds := map[string]bool{}
	for _, c := range cols {
		for k, v := range c.rpc {
			if v > 0 {
				kinds[k] = true
			}
		}
	}
	sorted := make([]string, 0, len(kinds))
	for k := range kinds {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	fmt.Printf("Per acquire+release pair, %d clients on as many resources, %v (background work included):\n\n", *countClients, *dur)
	fmt.Print("| |")
	for _, c := range cols {
		fmt.Printf(" %s |", c.name)
	}
	fmt.Print("\n| --- |")
	for range cols {
		fmt.Print(" --- |")
	}
	fmt.Println()
	row := func(label string, v func(column) float64) {
		fmt.Printf("| %s |", label)
		for _, c := range cols {
			fmt.Printf(" %.2f |", v(c)/float64(max(c.pairs, 1)))
		}
		fmt.Println()
	}
	fmt.Printf("| pairs |")
	for _, c := range cols {
		fmt.Printf(" %d |", c.pairs)
	}
	fmt.Println()
	row("CPU µs (process: clients and member)", func(c column) float64 { return float64(c.cpu.Microseconds()) })
	row("heap allocations (process)", func(c column) float64 { return float64(c.mallocs) })
	for _, k := range sorted {
		row("client: "+k, func(c column) float64 { return float64(c.rpc[k]) })
	}
	for _, m := range serverMetrics {
		row("server: "+m.label, func(c column) float64 { return c.srv[m.metric] })
	}
	return nil
}

// cpuTime is the CPU time this process has used, user and system. Per pair it depends far
// less on the machine's other load than pairs per second do.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mallocs is the number of heap allocations this process has made.
func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
	return v
}

// Shapes of rawTxnSystem's pair.
const (
	rawNarrow = iota // the Mutex's: one put with the lease; one delete
	rawFolded        // three compares, two puts; two compares, a delete returning the key, a put
	rawWide          // layout version 2's: three compares, four puts; three compares, a get, three deletes
	// rawLeast is the least that fenced's semantics write on etcd (layout version 3 without
	// its driver): the acquisition compares the gen key's released value and the epoch, puts
	// the gen key (the generation must outlive the etcd lease) and the owner key on the etcd
	// lease; the release compares the gen key's held value and the epoch, deletes the owner key
	// and puts the bare token back (so that a released lease is told from an expired one).
	rawLeast
)

// rawTxnSystem is a baseline for the counts: the acquire+release pair as bare Txns of one
// shape on one etcd lease granted once and kept alive, without a driver, so that the shapes tell what the
// extra keys of a pair cost the cluster.
func rawTxnSystem(cli *clientv3.Client, prefix string, shape int) (system, error) {
	lease, err := cli.Grant(context.Background(), 60)
	if err != nil {
		return system{}, err
	}
	alive, err := cli.KeepAlive(context.Background(), lease.ID) // one stream, as a session's
	if err != nil {
		return system{}, err
	}
	go func() {
		for range alive {
		}
	}()
	name := [...]string{"raw Txn 1 put+1 delete", "raw Txn 3 puts+1 delete", "raw Txn 4 puts+3 deletes",
		"raw Txn least: 3 puts+1 delete"}[shape]
	token := strings.Repeat("0", 40)
	var epoch []byte // rawLeast compares the epoch's value, as fenced does
	var provisioned sync.Map
	if shape == rawLeast {
		resp, err := cli.Get(context.Background(), prefix+"epoch")
		if err != nil {
			return system{}, err
		}
		if len(resp.Kvs) != 1 {
			return system{}, fmt.Errorf("%s: no epoch key under %s", name, prefix)
		}
		epoch = resp.Kvs[0].Value
	}
	return system{
		name: name, server: "etcd",
		lock: func(ctx context.Context, resource string) (held, error) {
			base := prefix + "raw/" + resource + "/"
			owner := base + "owner"
			if shape == rawLeast {
				gen := base + "gen"
				if _, done := provisioned.Load(gen); !done { // once per resource, before its first pair
					if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(gen), "=", 0)).
						Then(clientv3.OpPut(gen, token)).Commit(); err != nil {
						return nil, err
					}
					provisioned.Store(gen, true)
				}
				resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(gen), "=", token),
					clientv3.Compare(clientv3.Value(prefix+"epoch"), "=", string(epoch))).
					Then(clientv3.OpPut(gen, token+"an owner"), clientv3.OpPut(owner, "an owner", clientv3.WithLease(lease.ID))).
					Commit()
				if err != nil {
					return nil, err
				}
				if !resp.Succeeded {
					return nil, errBusy
				}
				return rawHeld{cli, base, shape, prefix + "epoch", string(epoch)}, nil
			}
			cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(owner), "=", 0)}
			ops := []clientv3.Op{clientv3.OpPut(owner, "an owner", clientv3.WithLease(lease.ID))}
			if shape != rawNarrow {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(base+"gen"), "!=", -1),
					clientv3.Compare(clientv3.CreateRevision(prefix+"epoch"), "!=", -1))
			}
			switch shape {
			case rawFolded:
				ops = append(ops, clientv3.OpPut(base+"gen", token+"an owner"))
			case rawWide:
				ops = append(ops, clientv3.OpPut(base+"gen", token),
					clientv3.OpPut(base+"holder", "an owner"), clientv3.OpPut(base+"until", "1764650000000000000"))
			}
			resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil {
				return nil, err
			}
			if !resp.Succeeded {
				return nil, errBusy
			}
			return rawHeld{cli: cli, base: base, shape: shape}, nil
		},
	}, nil
}

type rawHeld struct {
	cli             *clientv3.Client
	base            string
	shape           int
	epochKey, epoch string // rawLeast's
}

func (h rawHeld) write(ctx context.Context, p []byte) error { return h.release(ctx) }

func (h rawHeld) release(ctx context.Context) error {
	owner, gen, token := h.base+"owner", h.base+"gen", strings.Repeat("0", 40)
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	switch h.shape {
	case rawNarrow:
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.Value(owner), "=", "an owner")}
		ops = []clientv3.Op{clientv3.OpDelete(owner)}
	case rawFolded:
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.Value(gen), "=", token+"an owner"),
			clientv3.Compare(clientv3.CreateRevision(h.base+"epoch"), "!=", -1)}
		ops = []clientv3.Op{clientv3.OpDelete(owner, clientv3.WithPrevKV()), clientv3.OpPut(gen, token)}
	case rawLeast:
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.Value(gen), "=", token+"an owner"),
			clientv3.Compare(clientv3.Value(h.epochKey), "=", h.epoch)}
		ops = []clientv3.Op{clientv3.OpDelete(owner), clientv3.OpPut(gen, token)}
	case rawWide:
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.Value(owner), "=", "an owner"),
			clientv3.Compare(clientv3.Value(gen), "=", token),
			clientv3.Compare(clientv3.Value(h.base+"holder"), "=", "an owner")}
		ops = []clientv3.Op{clientv3.OpGet(owner), clientv3.OpDelete(owner),
			clientv3.OpDelete(h.base + "holder"), clientv3.OpDelete(h.base + "until")}
	}
	_, err := h.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	return err
}
