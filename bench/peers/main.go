// Command peers measures fenced beside the locks people use, in one process and one run, on
// the same servers: PostgreSQL advisory locks (pgx), redsync and redislock (Redis), and etcd's
// concurrency.Mutex, beside fenced on SQLite, PostgreSQL, Redis and etcd.
//
// Workloads, each run for -d per round, rounds taking turns (-rounds), medians reported:
//
//	single   one client: acquire+release pairs (p50 latency, pairs/s), and the write cycle
//	         (acquire, write 1 KiB, release; fenced: acquire, PublishAndRelease)
//	g16      16 clients on 16 resources: pairs/s
//	hot4     4 clients on one resource, each trying again at once when refused:
//	         handovers/s (acquisitions by another client than the last), gap p50/p99 (from
//	         the release to the next client's acquisition), fairness (fewest/most acquisitions)
//	stale    a holder pauses past its TTL, another client acquires, the first then writes:
//	         the fraction of those stale writes refused (-stale trials per system)
//	crash    a holder takes the resource with a short TTL and vanishes; another client tries
//	         every millisecond: how long after the TTL it gets the resource (the advisory
//	         lock has no TTL: its holder's connection closes, and the time is from the start)
//
// With -etcd-counts the workloads do not run: instead each etcd system, and bare Txns of three
// shapes beside them, runs 16 clients on 16 resources for -d, and the table gives per pair the
// etcd requests sent by kind, what the embedded member did (Raft proposals, WAL fsyncs and bytes, MVCC
// puts, deletes and ranges, lease grants, revocations and renewals) and the process's CPU time,
// which the machine's other load moves far less than pairs per second (counts.go). With
// -etcd-raw the same bare Txns also run through the workloads, beside the systems: "raw Txn
// least" is the fewest writes fenced's etcd semantics allow, without the driver, so fenced etcd
// / raw least is the driver's own cost and raw least / Mutex what the semantics cost.
//
// Every lock is taken with its try operation (no library back-off): fenced's Acquire answers
// busy at once, redsync runs with one try, redislock without retries, the Mutex with
// TryLock, the advisory lock with pg_try_advisory_lock.
//
// Servers: PostgreSQL at $FENCED_TEST_POSTGRES (default postgres://postgres@127.0.0.1:5432/
// postgres), Redis at $FENCED_TEST_REDIS (default redis://127.0.0.1:6379/0), and an etcd
// member embedded in this process (fsync on) unless $FENCED_BENCH_ETCD names a cluster.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredislib "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced"
	fencedetcd "github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/backend/postgres"
	fencedredis "github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/driver"
)

var (
	dur     = flag.Duration("d", time.Second, "how long each workload runs per round")
	rounds  = flag.Int("rounds", 3, "rounds; the systems take turns in each")
	trials  = flag.Int("stale", 3, "stale-write trials per system")
	only    = flag.String("only", "", "comma-separated system names to run (default: all)")
	skipTTL = flag.Bool("skip-stale", false, "skip the stale-write workload (it waits for TTLs)")
	aheadB  = flag.Duration("etcd-ahead-bound", 0, "fenced etcd's Options.AheadBound (0: its default)")
	eVar    = flag.Bool("etcd-variants", false, "also run fenced etcd without lease reuse (the driver before it: \"fenced etcd (no reuse)\") and with reuse but nothing granted ahead (\"fenced etcd (no ahead)\"), on the same cluster, taking turns with the others")
	cpuProf = flag.String("cpuprofile", "", "write a CPU profile of the rounds (not of the setup) to this file")
	memProf = flag.String("memprofile", "", "with -etcd-counts, write a heap profile (allocations) at the end to this file")
)

// errBusy is a refused try.
var errBusy = errors.New("busy")

// system is one lock implementation on one server.
type system struct {
	name, server string
	// lock tries once to take the resource; errBusy when it is held.
	lock func(ctx context.Context, resource string) (held, error)
	// stale runs one stale-write trial and reports whether the stale write was refused.
	stale func(ctx context.Context, resource string) (refused bool, err error)
	// crash takes the resource with a short TTL and vanishes; it returns how long after the
	// TTL (counted from the start of the acquisition) another client got the resource.
	crash func(ctx context.Context, resource string) (overshoot time.Duration, err error)
}

// held is a lock held: write stores a payload under the lock; release gives it up.
type held interface {
	write(ctx context.Context, payload []byte) error // the write cycle's write (fenced: and release)
	release(ctx context.Context) error
}

func main() {
	flag.Parse()
	ctx := context.Background()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	systems, cleanup, err := setup(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
	defer cleanup()
	if *only != "" {
		keep := strings.Split(*only, ",")
		systems = slices.DeleteFunc(systems, func(s system) bool { return !slices.Contains(keep, s.name) })
	}
	results := map[string]*result{}
	for _, s := range systems {
		results[s.name] = &result{}
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "peers: cpu profile:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *etcdCounts {
		if err := countEtcd(ctx, systems); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			pprof.StopCPUProfile()
			os.Exit(1)
		}
		if *memProf != "" {
			if err := writeHeapProfile(*memProf); err != nil {
				fmt.Fprintln(os.Stderr, "peers: heap profile:", err)
			}
		}
		return
	}
	for round := range *rounds {
		for _, s := range systems {
			fmt.Fprintf(os.Stderr, "round %d: %s\n", round+1, s.name)
			r := results[s.name]
			if err := r.run(ctx, s); err != nil {
				fmt.Fprintf(os.Stderr, "peers: %s: %v\n", s.name, err)
				os.Exit(1)
			}
		}
	}
	if !*skipTTL {
		for _, s := range systems {
			if s.stale == nil { // the bare Txn shapes (-etcd-raw): no lease object to pause
				continue
			}
			fmt.Fprintf(os.Stderr, "stale writes: %s\n", s.name)
			r := results[s.name]
			for i := range *trials {
				refused, err := s.stale(ctx, fmt.Sprintf("stale %d %s", i, rand.Text()[:8]))
				if err != nil {
					fmt.Fprintf(os.Stderr, "peers: %s: stale: %v\n", s.name, err)
					os.Exit(1)
				}
				r.staleTrials++
				if refused {
					r.staleRefused++
				}
				over, err := s.crash(ctx, fmt.Sprintf("crash %d %s", i, rand.Text()[:8]))
				if err != nil {
					fmt.Fprintf(os.Stderr, "peers: %s: crash: %v\n", s.name, err)
					os.Exit(1)
				}
				r.overshoot = append(r.overshoot, float64(over.Milliseconds()))
			}
		}
	}
	report(systems, results)
}

// result gathers each round's figures of one system.
type result struct {
	p50, pairs, cycleP50, g16, hot, gap50, gap99, fair []float64
	overshoot                                          []float64 // ms
	staleTrials, staleRefused                          int
}

func (r *result) run(ctx context.Context, s system) error {
	// single client: pairs, then the write cycle
	lat, n, err := loop(ctx, s, 1, nil)
	if err != nil {
		return err
	}
	r.p50 = append(r.p50, pct(lat, 50))
	r.pairs = append(r.pairs, float64(n)/dur.Seconds())
	payload := make([]byte, 1024)
	lat, _, err = loop(ctx, s, 1, payload)
	if err != nil {
		return err
	}
	r.cycleP50 = append(r.cycleP50, pct(lat, 50))
	_, n, err = loop(ctx, s, 16, nil)
	if err != nil {
		return err
	}
	r.g16 = append(r.g16, float64(n)/dur.Seconds())
	h, err := hot(ctx, s, 4)
	if err != nil {
		return err
	}
	r.hot = append(r.hot, h.handovers/dur.Seconds())
	r.gap50, r.gap99, r.fair = append(r.gap50, h.gap50), append(r.gap99, h.gap99), append(r.fair, h.fair)
	return nil
}

// loop runs acquire+release pairs (or write cycles) on workers clients, each on a resource of
// its own, for -d; it returns the pair latencies and how many completed.
func loop(ctx context.Context, s system, workers int, payload []byte) ([]time.Duration, int, error) {
	var (
		mu   sync.Mutex
		lats []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	deadline := time.Now().Add(*dur)
	prefix := rand.Text()[:8]
	for w := range workers {
		wg.Go(func() {
			resource := fmt.Sprintf("bench %s résource %d", prefix, w)
			var mine []time.Duration
			for time.Now().Before(deadline) {
				start := time.Now()
				h, err := s.lock(ctx, resource)
				if err == nil {
					if payload != nil {
						err = h.write(ctx, payload)
					} else {
						err = h.release(ctx)
					}
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, 0, errs[0]
	}
	return lats, len(lats), nil
}

type hotResult struct{ handovers, gap50, gap99, fair float64 }

// hot runs workers clients on one resource, each trying again at once when refused.
func hot(ctx context.Context, s system, workers int) (hotResult, error) {
	var (
		mu        sync.Mutex
		last      = -1
		released  time.Time
		gaps      []time.Duration
		handovers int
		counts    = make([]int, workers)
		errs      []error
		wg        sync.WaitGroup
	)
	resource := "hot " + rand.Text()[:8]
	deadline := time.Now().Add(*dur)
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				h, err := s.lock(ctx, resource)
				if errors.Is(err, errBusy) {
					continue
				}
				got := time.Now()
				if err == nil {
					mu.Lock()
					counts[w]++
					if last != -1 && last != w {
						handovers++
						gaps = append(gaps, got.Sub(released))
					}
					last = w
					mu.Unlock()
					err = h.release(ctx)
					mu.Lock()
					released = time.Now()
					mu.Unlock()
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return hotResult{}, errs[0]
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	fair := 0.0
	if hi > 0 {
		fair = float64(lo) / float64(hi)
	}
	return hotResult{handovers: float64(handovers), gap50: pct(gaps, 50), gap99: pct(gaps, 99), fair: fair}, nil
}

// pct is the p-th percentile in microseconds.
func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[(len(s)-1)*p/100].Microseconds())
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// report prints the tables.
func report(systems []system, results map[string]*result) {
	fmt.Printf("Go %s; %d rounds of %v per workload, medians; %d stale-write trials per system.\n\n", goVersion(), *rounds, *dur, *trials)
	fmt.Println("| system | server | p50 acquire+release | pairs/s, 1 client | p50 write cycle | pairs/s, 16 clients | hot: handovers/s | gap p50 / p99 | fairness (min/max) | stale writes refused | crashed holder: overshoot past the TTL |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, s := range systems {
		r := results[s.name]
		stale, over := "not run", "not run"
		if r.staleTrials > 0 {
			stale = fmt.Sprintf("%d/%d", r.staleRefused, r.staleTrials)
			over = fmt.Sprintf("%.0f ms (max %.0f)", median(r.overshoot), slices.Max(r.overshoot))
		}
		fmt.Printf("| %s | %s | %.0f µs | %.0f | %.0f µs | %.0f | %.0f | %.0f / %.0f µs | %.2f | %s | %s |\n",
			s.name, s.server, median(r.p50), median(r.pairs), median(r.cycleP50), median(r.g16),
			median(r.hot), median(r.gap50), median(r.gap99), median(r.fair), stale, over)
	}
	fmt.Println()
	fmt.Println("Ratios, fenced / peer on the same server (latency: below 1 is faster; throughput: above 1 is more):")
	fmt.Println()
	fmt.Println("| fenced | peer | p50 acquire+release | pairs/s, 16 clients | hot handovers/s |")
	fmt.Println("| --- | --- | --- | --- | --- |")
	for _, f := range systems {
		if !strings.HasPrefix(f.name, "fenced") {
			continue
		}
		for _, p := range systems {
			if p.server != f.server || strings.HasPrefix(p.name, "fenced") {
				continue
			}
			a, b := results[f.name], results[p.name]
			fmt.Printf("| %s | %s | %.2f | %.2f | %.2f |\n", f.name, p.name,
				median(a.p50)/median(b.p50), median(a.g16)/median(b.g16), median(a.hot)/median(b.hot))
		}
	}
	fmt.Println()
	fmt.Println("The same ratios in each round (the systems took turns within a round):")
	fmt.Println()
	fmt.Println("| fenced | peer | p50 acquire+release, per round | pairs/s 16 clients, per round |")
	fmt.Println("| --- | --- | --- | --- |")
	for _, f := range systems {
		if !strings.HasPrefix(f.name, "fenced") {
			continue
		}
		for _, p := range systems {
			if p.server != f.server || strings.HasPrefix(p.name, "fenced") {
				continue
			}
			a, b := results[f.name], results[p.name]
			var lat, thr []string
			for i := range min(len(a.p50), len(b.p50)) {
				lat = append(lat, fmt.Sprintf("%.2f", a.p50[i]/b.p50[i]))
				thr = append(thr, fmt.Sprintf("%.2f", a.g16[i]/b.g16[i]))
			}
			fmt.Printf("| %s | %s | %s | %s |\n", f.name, p.name, strings.Join(lat, ", "), strings.Join(thr, ", "))
		}
	}
	fmt.Println()
	fmt.Println("Versions:", versions())
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "?"
}

func versions() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "?"
	}
	var out []string
	for _, m := range bi.Deps {
		for _, name := range []string{"github.com/go-redsync/redsync/v4", "github.com/bsm/redislock",
			"go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/server/v3", "github.com/jackc/pgx/v5",
			"github.com/redis/go-redis/v9", "modernc.org/sqlite"} {
			if m.Path == name {
				out = append(out, m.Path+" "+m.Version)
			}
		}
	}
	return strings.Join(out, ", ")
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// setup connects to every server and returns the systems.
func setup(ctx context.Context) ([]system, func(), error) {
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) ([]system, func(), error) { cleanup(); return nil, nil, err }
	var systems []system

	// SQLite
	dir, err := os.MkdirTemp("", "fenced-peers-")
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	sd, err := sqlite.Open(filepath.Join(dir, "fenced.db"))
	if err != nil {
		return fail(err)
	}
	st, err := store(ctx, sd, false)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = st.Close() })
	systems = append(systems, fencedSystem("fenced SQLite", "SQLite", st, 50*time.Millisecond))

	// PostgreSQL: fenced on a schema of its own, with Open's default pool, and advisory locks
	// on a pool of the same size.
	pgURL := env("FENCED_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres")
	admin, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return fail(fmt.Errorf("postgres: %w", err))
	}
	schema := "fenced_peers_" + strings.ToLower(rand.Text()[:12])
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(context.Background())
	})
	u, _ := url.Parse(pgURL)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pd, err := postgres.Open(ctx, u.String())
	if err != nil {
		return fail(err)
	}
	pst, err := store(ctx, pd, false)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = pst.Close() })
	systems = append(systems, fencedSystem("fenced PostgreSQL", "PostgreSQL", pst, 50*time.Millisecond))
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return fail(err)
	}
	pcfg.MaxConns = pd.Pool().Config().MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, pool.Close)
	if _, err := pool.Exec(ctx, "CREATE TABLE peers_data (resource text PRIMARY KEY, payload bytea)"); err != nil {
		return fail(err)
	}
	systems = append(systems, advisorySystem(pool))

	// Redis
	redisURL := env("FENCED_TEST_REDIS", "redis://127.0.0.1:6379/0")
	ropt, err := goredislib.ParseURL(redisURL)
	if err != nil {
		return fail(err)
	}
	ropt.PoolSize = 16
	rcli := goredislib.NewClient(ropt)
	cleanups = append(cleanups, func() { _ = rcli.Close() })
	prefix := "fenced-peers:" + rand.Text()[:8] + ":"
	rst, err := store(ctx, fencedredis.New(rcli, &fencedredis.Options{KeyPrefix: prefix}), true)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() {
		keys, _ := rcli.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			_ = rcli.Del(context.Background(), keys...).Err()
		}
	})
	systems = append(systems, fencedSystem("fenced Redis", "Redis", rst, 50*time.Millisecond))
	systems = append(systems, redsyncSystem(rcli, prefix), redislockSystem(rcli, prefix))

	// etcd
	endpoints := strings.Split(os.Getenv("FENCED_BENCH_ETCD"), ",")
	if endpoints[0] == "" {
		e, ep, err := startEtcd(dir)
		if err != nil {
			return fail(err)
		}
		cleanups = append(cleanups, e.Close)
		endpoints = []string{ep}
	}
	ecfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if *etcdCounts {
		ecfg.DialOptions = rpcs.dialOptions()
	}
	ecli, err := clientv3.New(ecfg)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = ecli.Close() })
	eprefix := "/fenced-peers/" + rand.Text()[:8] + "/"
	est, err := store(ctx, fencedetcd.New(ecli, &fencedetcd.Options{Prefix: eprefix, AheadBound: *aheadB}), false)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() {
		_ = est.Close()
		_, _ = ecli.Delete(context.Background(), eprefix, clientv3.WithPrefix())
	})
	systems = append(systems, fencedSystem("fenced etcd", "etcd", est, 2*time.Second))
	if *eVar {
		for _, v := range []struct {
			name string
			opts fencedetcd.Options
		}{
			{"fenced etcd (no reuse)", fencedetcd.Options{Prefix: eprefix, AheadBound: *aheadB, DisableLeaseReuse: true}},
			{"fenced etcd (no ahead)", fencedetcd.Options{Prefix: eprefix, AheadBound: -1}},
		} {
			vst, err := store(ctx, fencedetcd.New(ecli, &v.opts), false)
			if err != nil {
				return fail(err)
			}
			cleanups = append(cleanups, func() { _ = vst.Close() })
			systems = append(systems, fencedSystem(v.name, "etcd", vst, 2*time.Second))
		}
	}
	systems = append(systems, mutexSystem(ecli, eprefix))
	if *etcdCounts || *etcdRaw {
		for _, shape := range []int{rawNarrow, rawFolded, rawWide, rawLeast} {
			raw, err := rawTxnSystem(ecli, eprefix, shape)
			if err != nil {
				return fail(err)
			}
			systems = append(systems, raw)
		}
	}
	return systems, cleanup, nil
}

func store(ctx context.Context, d driver.Driver, allowNonDurable bool) (*fenced.Store, error) {
	return fenced.New(ctx, d, &fenced.Config{AllowNonDurable: allowNonDurable})
}

func startEtcd(dir string) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Name = "peers"
	cfg.Dir = filepath.Join(dir, "etcd")
	peer, err := freeURL()
	if err != nil {
		return nil, "", err
	}
	client, err := freeURL()
	if err != nil {
		return nil, "", err
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd: not ready after 30 s")
	}
	return e, client.Host, nil
}

// writeHeapProfile writes the allocations made so far (pprof's alloc_objects and alloc_space).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
