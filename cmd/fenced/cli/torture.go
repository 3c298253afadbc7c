package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/driver"
)

// violationsError ends a torture run that found violations (exit code 7).
type violationsError struct{ n int }

func (e *violationsError) Error() string { return fmt.Sprintf("%d violations found", e.n) }

// tortureOptions are the flags of fenced torture.
type tortureOptions struct {
	seed         uint64
	duration     time.Duration
	workers      int
	resources    int
	faults       string
	unfenced     bool
	gate         bool
	artifacts    bool         // publish through artifacts (torture_artifact.go)
	store        string       // the artifacts' store; default a folder in the report directory
	azure        tortureAzure // --azure, --azure-mode
	report       string
	checkTimeout time.Duration
	// restoreWithoutBump is the restore fault's control: the copy restored and no bump.
	restoreWithoutBump bool
	restartCmd         string // the restart fault's command, for servers torture cannot restart itself
	restoreCmd         string // the restore fault's command for etcd: the snapshot put back, the members started
	mutant             string // a planted bug in the workers' driver (tests only)
	shortBuilds        bool   // no build outlasts its lease: the stale writes left are the faults' (controls only)
	partitionDev       string // the partition fault's network interface
	workerNetns        int    // worker slots each in a network namespace of its own (isolate.go)
}

func (a *app) tortureCmd() *cobra.Command {
	var o tortureOptions
	cmd := &cobra.Command{
		Use:   "torture [--seed N] [--duration D] [--workers N] [--resources N] [--faults LIST] [--unfenced] [--gate] [--report DIR]",
		Short: "Check the protocol under faults: worker processes, a nemesis, and a linearizability checker",
		Long: `Run worker processes that loop acquire (TTL 300-800ms), build (a short pause), publish a payload
naming (worker, generation, sequence) and release, on a few resources, while a nemesis injects
faults; then check every recorded operation against a model of the protocol and the
invariants a history can show. Each worker records a CALL before sending each request and a
RETURN after its reply, stamped with the system-wide monotonic clock; an operation without a
definite reply may or may not have happened.

The database is --db or $FENCED_DB; otherwise a SQLite file in a new temporary directory,
removed afterwards (never ./fenced.db). Its resources are new rows named torture-<run>-<n>.

Faults (--faults, comma-separated; default: every one that applies to the database):
  pause       SIGSTOP a worker while it builds, for longer than its TTL, then SIGCONT
  kill        kill -9 a worker in the middle of an operation; a new process (new identity)
              takes its place
  drop-reply  inside a worker, a reply is discarded after the database ran the statement
  restart     restart the database server on this machine: PostgreSQL (pg_ctlcluster) or
              MariaDB (SHUTDOWN, then mariadbd started again), or any server with
              --restart-cmd (e.g. kill -9 of a redis-server with appendfsync always, or of an
              etcd member, and its start from the same data directory: on etcd it must
              crash the URL's first endpoint's member, which torture makes the leader before
              the first restart and a follower before the next, in turn, and waits until it
              has rejoined); not applicable to SQLite
  clock       jump the database clock forward and back: SQLite only (an offset file read by
              every statement); PostgreSQL's clock_timestamp() cannot be offset
  rowlock     hold a leased resource's row lock (FOR UPDATE, or an UPDATE rolled back) until
              after the lease expired, while its renewal or publication waits on it: PostgreSQL
              and MariaDB; the checker flags any of them accepted
  partition   set --partition-dev down for 1-3s, then up: the host side of a veth pair to a
              network namespace the database server runs in (see docs/TORTURE.md); on etcd,
              the link between the member the clients use and its peers, that member made
              the leader before the first cut and a follower before the next, in turn;
              needs root and --partition-dev
  loss        drop 5-60% of the frames through --partition-dev at random, each way, for 1-3s
              (an nftables rule on the device; TCP retransmits what is lost): real loss
              where tc netem is missing; needs root, --partition-dev and nft
  delay       put a TCP proxy of the run's own between the workers and the server, and make
              it delay every byte (a latency with jitter, for 1-3s), stall about half the
              connections (nothing passes for longer than any TTL, then everything held goes
              through late: loss as TCP sees it) or reset about half of them; every backend
              with a host:port (not SQLite)
  isolate     cut one worker (now and then a minority) off from the database for 1-3s, the
              moment it starts a build holding a lease, then heal it: its requests arrive
              late, after another worker took the lease over; needs --worker-netns N (those
              workers in network namespaces of their own, the server reached from here
              through a veth pair or a bridge; see docs/TORTURE.md)
  bump        fenced epoch bump while the workers run (every lease of the store is freed)
  restore     copy the torture's rows and the epoch with the workers held at a barrier, let them
              go on 2-4s, hold them again, restore the copy and bump the epoch (SQLite,
              PostgreSQL, MariaDB, Redis; etcd: a snapshot of the cluster, put back by
              --restore-cmd); --restore-without-bump leaves the bump out and must report
              violations: it restores once, and only a copy that the workers have gone past
bump and restore act on the whole store's epoch: they are in the default set only on the
temporary SQLite file, and must be named in --faults on a store of --db (use a store that
nothing else uses).

--unfenced runs the same schedule with a plain lock: the same acquisitions, then an
unconditional write of the payload (SQLite, PostgreSQL, MariaDB, Redis, etcd). It must report
violations.

--gate also runs a participating service (destination/gate on a SQLite file of its own, on
loopback): each worker fences it right after acquiring and sends its build's result to it
with the lease's Fencing-Token before publishing. The checker then also requires that the
service accepted no write carrying a token older than one whose holder had fenced before the
write was sent. With --unfenced the workers do not fence (the high-water mark alone), and the
checker holds the service to the acquisitions instead: it must report violations there too.

The same seed gives the same schedule (the nemesis's choices, the workers' draws); the
interleaving of the processes is the operating system's, so runs differ in detail.
The report is printed and written as a self-contained HTML page in --report DIR (default: a
new temporary directory, kept), with every history file.

Exit code 7: violations found; 1: the model check of some resource did not finish (time or
step budget) and nothing was violated, so the run proves nothing there.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("seed") {
				o.seed = uint64(time.Now().UnixNano() % 1_000_000)
			}
			return a.torture(cmd, o)
		}),
	}
	f := cmd.Flags()
	f.Uint64Var(&o.seed, "seed", 0, "seed of the schedule (default: chosen from the time and printed)")
	f.DurationVar(&o.duration, "duration", 30*time.Second, "how long the workers run (with the pause fault, longer if no pause has landed by then)")
	f.IntVar(&o.workers, "workers", 4, "worker processes")
	f.IntVar(&o.resources, "resources", 3, "resources")
	f.StringVar(&o.faults, "faults", "", "faults to inject: "+strings.Join(torture.AllFaults, ",")+" (default: all that apply)")
	f.BoolVar(&o.unfenced, "unfenced", false, "use a plain lock (unconditional write): the checker must find violations")
	f.BoolVar(&o.artifacts, "artifacts", false, "publish every result as an artifact in a blob store and read it back through its pointer")
	f.StringVar(&o.store, "store", "", "the artifacts' store URL (default: a folder in the report directory)")
	f.BoolVar(&o.gate, "gate", false, "also write through a participating service's gate, fenced on acquisition (not with --unfenced)")
	o.azure.flags(f)
	f.StringVar(&o.report, "report", "", "directory for the HTML report and the histories (default: a new temporary directory)")
	f.DurationVar(&o.checkTimeout, "check-timeout", time.Minute, "bound on the model check of each resource")
	f.StringVar(&o.restartCmd, "restart-cmd", "", "shell command that restarts (or crashes and starts) the database server, for the restart fault; torture then waits for its port")
	f.StringVar(&o.restoreCmd, "restore-cmd", "", "etcd only: shell command that stops the members, restores the snapshot file $FENCED_SNAPSHOT into fresh data directories and starts them, for the restore fault")
	f.StringVar(&o.partitionDev, "partition-dev", "", "network interface the partition fault sets down and up, and the loss fault drops frames on: the host side of a veth pair to the database server's network namespace (etcd: the clients' member's link to its peers)")
	f.IntVar(&o.workerNetns, "worker-netns", 0, "run the first N worker slots each in a network namespace of its own, reached through a veth pair and routed to the database server's namespace, so that the isolate fault can cut one off (0: none; needs root)")
	f.StringVar(&o.mutant, "mutant", "", "a planted bug in the workers' driver, for the tests: "+mutantRenewAfterExpiry+", "+mutantBusyAfterExpiry)
	_ = f.MarkHidden("mutant")
	f.BoolVar(&o.shortBuilds, "short-builds", false, "keep every build short, so that only the faults hold a write past its lease (for the controls)")
	_ = f.MarkHidden("short-builds")
	f.BoolVar(&o.restoreWithoutBump, "restore-without-bump", false, "the restore fault's control: restore the copy without bumping the epoch (violations expected)")
	return cmd
}

// faultPlan says which faults apply to a database, and why the others do not. restartErr is
// why the database's server cannot be restarted from here (nil when it can).
func faultPlan(scheme string, restartErr, restoreErr, partitionErr, lossErr, delayErr error, ownStore, explicit bool, requested []string, isolateErr error) (use []string, notApplicable map[string]string) {
	why := map[string]string{}
	if isolateErr != nil {
		why[torture.FaultIsolate] = isolateErr.Error()
	}
	if delayErr != nil {
		why[torture.FaultDelay] = delayErr.Error()
	}
	if partitionErr != nil {
		why[torture.FaultPartition] = partitionErr.Error()
	}
	if lossErr != nil {
		why[torture.FaultLoss] = lossErr.Error()
	}
	if restartErr != nil {
		why[torture.FaultRestart] = restartErr.Error()
	}
	if restoreErr != nil {
		why[torture.FaultRestore] = restoreErr.Error()
	}
	if !ownStore && !explicit {
		const whole = "acts on the whole store's epoch: name it in --faults, on a store that nothing else uses"
		for _, f := range []string{torture.FaultBump, torture.FaultRestore} {
			if _, ok := why[f]; !ok {
				why[f] = whole
			}
		}
	}
	switch scheme {
	case "sqlite":
		why[torture.FaultRowLock] = "not applicable to SQLite: no row locks; a statement takes the one write lock before it reads the clock"
	case "postgres", "postgresql":
		why[torture.FaultClock] = "not applicable to PostgreSQL: clock_timestamp() is the server's system clock and has no offset to inject"
	case "mysql", "mariadb":
		why[torture.FaultClock] = "not applicable to MariaDB: UTC_TIMESTAMP(6) is the server's system clock and has no offset to inject"
	default:
		why[torture.FaultClock] = "torture has no way to move its clock (not implemented for " + scheme + ")"
		why[torture.FaultRowLock] = "torture has no way to hold one of its rows (not implemented for " + scheme + ")"
	}
	notApplicable = map[string]string{}
	for _, f := range requested {
		if reason, ok := why[f]; ok {
			notApplicable[f] = reason
			continue
		}
		use = append(use, f)
	}
	return use, notApplicable
}

// openTorture opens the database; a SQLite file gets the clock offset file, so that the clock
// fault can move the clock of every process at once.
func openTorture(ctx context.Context, url, clockFile string) (driver.Driver, error) {
	if clockFile != "" {
		if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
			return sqlite.Open(strings.TrimPrefix(path, "//"), sqlite.WithClockOffsetFile(clockFile))
		}
	}
	return openDriver(ctx, url)
}

// naiveWrite is a plain lock's write for the backends that support --unfenced.
func naiveWrite(drv driver.Driver) (torture.NaiveWrite, error) {
	switch d := drv.(type) {
	case *sqlite.Driver:
		return func(ctx context.Context, l driver.LeaseRef, payload []byte) error {
			_, err := d.DB().ExecContext(ctx, `UPDATE fenced_resources
				SET payload = ?, published_generation = ?, published_at = CAST(unixepoch('subsec') * 1000000 AS INTEGER)
				WHERE resource = ?`, payload, l.Generation, l.Resource)
			return err
		}, nil
	case *postgres.Driver:
		return func(ctx context.Context, l driver.LeaseRef, payload []byte) error {
			_, err := d.Pool().Exec(ctx, `UPDATE fenced_resources
				SET payload = $1, published_generation = $2, published_at = clock_timestamp()
				WHERE resource = $3`, payload, l.Generation, l.Resource)
			return err
		}, nil
	case *mysql.Driver:
		return func(ctx context.Context, l driver.LeaseRef, payload []byte) error {
			_, err := d.DB().ExecContext(ctx, `UPDATE fenced_resources
				SET payload = ?, published_generation = ?, published_epoch = ?, published_at = UTC_TIMESTAMP(6)
				WHERE resource = ?`, payload, l.Generation, l.Epoch, l.Resource)
			return err
		}, nil
	case *redis.Driver:
		return func(ctx context.Context, l driver.LeaseRef, payload []byte) error {
			return d.Client().HSet(ctx, d.Key(l.Resource), "payload", payload, "published_generation", l.Generation,
				"published_epoch", l.Epoch).Err()
		}, nil
	case *etcd.Driver:
		return func(ctx context.Context, l driver.LeaseRef, payload []byte) error {
			return d.PublishUnfenced(ctx, l.Resource, l.Epoch, l.Generation, payload)
		}, nil
	}
	return nil, usagef("--unfenced is not implemented for %s (SQLite, PostgreSQL, MariaDB, Redis and etcd have a plain lock's write)", backendName(drv))
}

// engineClock reports whether the engine's replies carry its own clock (etcd's do not: a
// lease's expiry there is the client's clock plus the etcd lease's TTL in whole seconds).
func engineClock(url string) bool {
	scheme, _, _ := strings.Cut(url, ":")
	scheme = strings.ToLower(scheme)
	return scheme != "etcd" && scheme != "etcds"
}

// unfencedSchemes are the URL schemes naiveWrite has a plain lock's write for.
var unfencedSchemes = map[string]bool{"sqlite": true, "postgres": true, "postgresql": true, "mysql": true, "mariadb": true,
	"redis": true, "rediss": true, "etcd": true, "etcds": true}

// restoreApplies says whether newStoreCopy can copy a store of this scheme, or why not.
func restoreApplies(scheme, restoreCmd string) error {
	switch scheme {
	case "sqlite", "postgres", "postgresql", "mysql", "mariadb", "redis", "rediss":
		return nil
	case "etcd", "etcds":
		return etcdRestoreApplies(restoreCmd)
	}
	return fmt.Errorf("not implemented for %s: the restore fault copies SQL tables (SQLite, PostgreSQL, MariaDB), Redis keys or an etcd snapshot", scheme)
}

// engineLabel names the engine of a URL scheme for a message.
func engineLabel(scheme string) string {
	switch scheme {
	case "sqlite":
		return "SQLite"
	case "postgres", "postgresql":
		return "PostgreSQL"
	case "mysql", "mariadb":
		return "MariaDB"
	case "redis", "rediss":
		return "Redis"
	}
	return scheme
}

// backendName names the driver's engine for a message.
func backendName(drv driver.Driver) string {
	name := fmt.Sprintf("%T", drv) // *etcd.Driver
	name = strings.TrimPrefix(strings.TrimSuffix(name, ".Driver"), "*")
	return name
}

func (a *app) torture(cmd *cobra.Command, o tortureOptions) error {
	ctx := cmd.Context()
	switch {
	case o.duration < 3*time.Second:
		return usagef("invalid --duration %s: at least 3s", o.duration)
	case o.workers < 1 || o.workers > 64:
		return usagef("invalid --workers %d: 1 to 64", o.workers)
	case o.resources < 1 || o.resources > 100:
		return usagef("invalid --resources %d: 1 to 100", o.resources)
	case o.checkTimeout <= 0:
		return usagef("invalid --check-timeout %s: more than 0", o.checkTimeout)
	}
	requested, explicit := torture.AllFaults, o.faults != ""
	if explicit {
		var err error
		if requested, err = torture.ParseFaults(o.faults); err != nil {
			return usagef("invalid --faults: %v", err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}

	// The database: --db, $FENCED_DB, else a temporary SQLite file.
	url := a.dbURL(cmd)
	if !cmd.Flags().Changed("db") && os.Getenv("FENCED_DB") == "" {
		tmp, err := os.MkdirTemp("", "fenced-torture-db-")
		if err != nil {
			return fmt.Errorf("create temporary directory: %w", err)
		}
		defer os.RemoveAll(tmp)
		url = "sqlite:" + filepath.Join(tmp, "torture.db")
	}
	scheme, _, _ := strings.Cut(url, ":")
	scheme = strings.ToLower(scheme)
	restart, restartErr := serverRestart(scheme, url)
	if o.restartCmd != "" {
		if restart, restartErr = commandRestart(scheme, url, o.restartCmd); restartErr != nil {
			return usagef("invalid --restart-cmd: %v", restartErr)
		}
	}
	ownStore := !cmd.Flags().Changed("db") && os.Getenv("FENCED_DB") == ""
	if o.unfenced && !unfencedSchemes[scheme] {
		return usagef("--unfenced is not implemented for %s: SQLite, PostgreSQL, MariaDB, Redis and etcd have a plain lock's write", scheme)
	}
	partitionErr := errors.New("needs --partition-dev, the host side of a veth pair to the database server's network namespace")
	if o.partitionDev != "" {
		if scheme == "sqlite" {
			return usagef("invalid --partition-dev: SQLite is embedded in each process, there is no network to cut")
		}
		if _, err := net.InterfaceByName(o.partitionDev); err != nil {
			return usagef("invalid --partition-dev %q: no such network interface", o.partitionDev)
		}
		if _, err := exec.LookPath("ip"); err != nil {
			return usagef("invalid --partition-dev: the partition fault needs ip (iproute2)")
		}
		partitionErr = nil
	}
	if o.restoreCmd != "" {
		if scheme != "etcd" && scheme != "etcds" {
			return usagef("invalid --restore-cmd: it applies to etcd only (the restore fault copies and restores the torture's own rows or keys on %s)", engineLabel(scheme))
		}
		if _, err := portToWait(url, "restore"); err != nil {
			return usagef("invalid --restore-cmd: %v", err)
		}
	}
	isolateErr, delayErr := errors.New("needs --worker-netns N: workers in network namespaces of their own, the database server reached through a veth pair"), delayApplies(scheme, url)
	var serverLinks []string
	if o.workerNetns != 0 {
		if serverLinks, err = workerNetnsApplies(o.workerNetns, o.workers, scheme, url, o.gate, o.azure.url); err != nil {
			return err
		}
		isolateErr = nil
		if delayErr == nil {
			delayErr = errors.New("not applicable with --worker-netns: the proxies listen on this host's loopback, which a worker in a namespace of its own cannot reach")
		}
	}
	faults, notApplicable := faultPlan(scheme, restartErr, restoreApplies(scheme, o.restoreCmd), partitionErr, lossApplies(partitionErr), delayErr, ownStore, explicit, requested, isolateErr)
	if explicit {
		// A fault named in --faults that cannot be injected here is refused, by name.
		for _, f := range requested {
			if why, ok := notApplicable[f]; ok {
				label := engineLabel(scheme)
				why = strings.TrimPrefix(why, "not applicable to "+label+": ")
				return usagef("the %s fault does not apply to %s: %s", f, label, why)
			}
		}
	}
	if err := o.azure.validate(o); err != nil {
		return err
	}
	if o.restoreCmd != "" && !contains(faults, torture.FaultRestore) {
		return usagef("--restore-cmd needs the restore fault (name it in --faults)")
	}
	if o.restoreWithoutBump && !contains(faults, torture.FaultRestore) {
		return usagef("--restore-without-bump needs the restore fault")
	}
	if err := checkTortureArtifacts(o); err != nil {
		return err
	}
	runID := strings.ToLower(rand.Text()[:6])
	resources := make([]string, o.resources)
	for i := range resources {
		resources[i] = fmt.Sprintf("torture-%s-%d", runID, i+1)
	}

	dir := o.report
	if fi, err := os.Stat(dir); dir != "" && err == nil && !fi.IsDir() {
		return usagef("invalid --report %s: not a directory", dir)
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "fenced-torture-"); err != nil {
			return fmt.Errorf("create report directory: %w", err)
		}
	}
	hist := filepath.Join(dir, "history")
	if err := os.MkdirAll(hist, 0o755); err != nil {
		return fmt.Errorf("create report directory: %w", err)
	}
	if old, _ := filepath.Glob(filepath.Join(hist, "*.jsonl")); len(old) > 0 {
		return usagef("the report directory %s already holds a history; choose another --report", dir)
	}
	clockFile := ""
	if scheme == "sqlite" {
		clockFile = filepath.Join(dir, "clock-offset-us")
		if err := os.WriteFile(clockFile, []byte("0\n"), 0o644); err != nil {
			return fmt.Errorf("write clock offset: %w", err)
		}
	}

	drv, err := openTorture(ctx, url, clockFile)
	if err != nil {
		return err
	}
	copier, _ := newStoreCopy(drv, runID, resources, filepath.Join(dir, "etcd.snapshot"), o.restoreCmd, url)
	store, err := fenced.New(ctx, drv, &fenced.Config{AllowNonDurable: a.allowNonDur})
	if err != nil {
		_ = drv.Close()
		return err
	}
	defer store.Close()
	if o.unfenced {
		if _, err := naiveWrite(drv); err != nil {
			return err
		}
	}
	if err := store.Provision(ctx, resources...); err != nil {
		return err
	}
	init := map[string]torture.State{}
	for _, r := range resources {
		st, err := drv.Read(ctx, r)
		if err != nil {
			return fmt.Errorf("read %s: %w", r, err)
		}
		payload, _, err := drv.ReadPayload(ctx, r)
		if err != nil {
			return fmt.Errorf("read %s: %w", r, err)
		}
		init[r] = torture.State{Epoch: st.CurrentEpoch, Generation: st.Generation, Owner: st.Owner, PublishedGeneration: st.PublishedGeneration, Payload: string(payload)}
	}
	// Beside the histories, so that the report directory can be checked again later.
	if err := torture.WriteInitial(dir, init); err != nil {
		return err
	}

	plan := torture.Plan(o.seed, o.duration, o.workers, faults)
	if o.restoreWithoutBump {
		plan = firstRestoreOnly(plan)
	}
	where := scheme
	if !cmd.Flags().Changed("db") && os.Getenv("FENCED_DB") == "" {
		where = "SQLite in a temporary directory"
	}
	mode := "fenced"
	if o.unfenced {
		mode = "UNFENCED (plain lock)"
	}
	if o.restoreWithoutBump {
		mode += ", restores WITHOUT an epoch bump"
	}
	fmt.Fprintf(a.stdout, "fenced torture: seed %d, %s, %d workers, %d resources, %s, %s; faults %s; %d nemesis actions planned\n",
		o.seed, o.duration, o.workers, o.resources, where, mode, orNone(strings.Join(faults, ",")), len(plan))
	fmt.Fprintf(a.stdout, "histories in %s\n", hist)

	workerURL, proxies := url, []*torture.Proxy(nil)
	if contains(faults, torture.FaultDelay) {
		if proxies, workerURL, err = startProxies(url, o.seed); err != nil {
			return err
		}
		defer func() {
			for _, p := range proxies {
				_ = p.Close()
			}
		}()
		fmt.Fprintln(a.stdout, proxyNote(proxies))
	}
	var nets *workerNets
	if o.workerNetns > 0 {
		if nets, err = newWorkerNets(ctx, o.workerNetns, serverLinks); err != nil {
			return fmt.Errorf("create the workers' network namespaces: %w", err)
		}
		defer func() {
			if err := nets.close(); err != nil {
				fmt.Fprintf(a.stdout, "removing the workers' network namespaces: %v\n", err)
			}
		}()
		fmt.Fprintf(a.stdout, "worker slots 1 to %d each in a network namespace of its own (%s …), on %s.0/24, routed to the server through %s\n",
			o.workerNetns, nets.ns(0), nets.subnet, orNone(strings.Join(serverLinks, ", ")))
	}
	t := &tortureRun{nets: nets, a: a, o: o, exe: exe, url: url, workerURL: workerURL, proxies: proxies, clockFile: clockFile, hist: hist, resources: resources,
		faults: faults, procs: make([]*tortureProc, o.workers), restart: restart, copier: copier,
		barrierPath: filepath.Join(dir, "barrier")}
	if contains(faults, torture.FaultRestore) {
		defer copier.drop(context.WithoutCancel(ctx))
	} else {
		t.copier = nil
	}
	if o.gate {
		svc, err := startTortureGate(ctx, filepath.Join(dir, "gate.db"), resources)
		if err != nil {
			return err
		}
		defer svc.close()
		t.gateURL = svc.url
		fmt.Fprintf(a.stdout, "participating service (gate) on %s, workers %s\n", svc.url,
			map[bool]string{true: "do not fence it", false: "fence it on acquisition"}[o.unfenced])
	}
	if o.artifacts {
		ad, err := t.openArtifacts(ctx, drv, dir)
		if err != nil {
			return err
		}
		defer ad.b.Close()
		drv = ad
	}
	azureArgs, dropContainer, err := o.azure.start(ctx)
	if err != nil {
		return err
	}
	defer dropContainer()
	if len(azureArgs) > 0 {
		t.azureArgs = azureArgs
		fmt.Fprintf(a.stdout, "Azure blobs (%s) in container %s at %s, workers %s\n", o.azure.mode, azureArgs[3], o.azure.url,
			o.azure.how(o.unfenced))
	}
	started := time.Now()
	if err := t.execute(ctx, drv, plan); err != nil {
		return err
	}
	elapsed := time.Since(started)
	interrupted := ctx.Err() != nil
	if interrupted {
		// Ctrl-C: the workers are stopped; what they recorded is still checked and reported.
		fmt.Fprintf(a.stdout, "interrupted after %s: the workers are stopped; checking what they recorded\n", elapsed.Round(time.Millisecond))
	}

	h, err := torture.Load(hist)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "checking %d operations...\n\n", len(h.Ops))
	res := torture.Check(h, init, o.checkTimeout)
	rep := &torture.Report{Run: torture.Run{Seed: o.seed, Duration: o.duration, Workers: o.workers, Resources: resources,
		Database: where, Unfenced: o.unfenced, Faults: faults, NotApplicable: notApplicable, Plan: plan, Elapsed: elapsed},
		History: h, Result: res}
	rep.WriteText(a.stdout)
	path, err := rep.WriteHTML(dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "report: %s\n", path)
	if interrupted {
		if err := verdict(res); err != nil {
			return err
		}
		return fmt.Errorf("torture interrupted after %s (report written): %w", elapsed.Round(time.Millisecond), ctx.Err())
	}
	return verdict(res)
}

// verdict is the run's outcome once its history is checked: violations are exit 7, and a
// model check that did not finish on some resource is an operational error (exit 1), never a
// pass, whatever the other resources showed.
func verdict(res *torture.Result) error {
	switch {
	case !res.OK():
		return &violationsError{n: len(res.Violations)}
	case len(res.Inconclusive) > 0:
		return fmt.Errorf("the model check did not finish on %d resources %q; a larger --check-timeout may let it finish",
			len(res.Inconclusive), res.Inconclusive)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// tortureRun is the parent's side of one run: the worker slots, the nemesis and the reader.
type tortureRun struct {
	restart   restartFunc // nil unless the restart fault applies
	a         *app
	o         tortureOptions
	exe, url  string
	workerURL string           // url, or the same through the delay fault's proxies
	proxies   []*torture.Proxy // the delay fault's, one per address of url
	clockFile string
	hist      string
	resources []string
	faults    []string
	gateURL   string   // the participating service of --gate, or ""
	storeURL  string   // the artifacts' store of --artifacts, or ""
	azureArgs []string // the workers' --azure arguments, or none

	mu           sync.Mutex
	procs        []*tortureProc // current process of each slot
	until        time.Time      // workers start no new iteration after it (see end)
	planned      time.Time      // until as planned: the start plus --duration
	pausePending bool           // the plan has a pause and none has landed yet (pause)
	nem          *torture.Recorder
	drv          driver.Driver // the parent's own connections (reader, rowlock)

	copier      storeCopier      // nil unless the restore fault applies
	barrierPath string           // held shared by every request, exclusively by the restore fault
	barrier     *torture.Barrier // the nemesis's own open file description of it
	partitions  int              // partition faults so far (etcd: the cut member's role alternates)
	restarts    int              // restart faults so far (etcd: the crashed member's role alternates)
	nets        *workerNets      // --worker-netns, or nil

	// built is the highest generation of each resource a worker has reported acquiring (its
	// "build RESOURCE GENERATION" phase line, written after the acquisition's RETURN record),
	// and builtSeen is closed and replaced at each report: how the isolate fault waits for
	// another worker to take a cut-off worker's lease over (awaitTakeover).
	built     map[string]int64
	builtSeen chan struct{}
}

// tortureProc is one worker process seen from the parent.
type tortureProc struct {
	slot int
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped

	control io.WriteCloser // the worker's stdin when it takes hold requests (--hold), or nil

	mu   sync.Mutex
	trap *trap
}

// tell writes one control line to the worker (torture.Hold); a worker that takes none, or has
// exited, ignores it.
func (p *tortureProc) tell(line string) {
	if p.control != nil {
		_, _ = io.WriteString(p.control, line+"\n")
	}
}

// trap makes the stdout reader act the moment a worker reports a phase: a pause lands in the
// build, a kill during a request, not at some random point.
type trap struct {
	prefix string
	fire   func(line string)
	fired  chan struct{}
}

func (p *tortureProc) setTrap(prefix string, fire func(string)) *trap {
	tr := &trap{prefix: prefix, fire: fire, fired: make(chan struct{})}
	p.mu.Lock()
	p.trap = tr
	p.mu.Unlock()
	return tr
}

// spring fires the trap once, unless it already went off; it reports whether it fired.
func (p *tortureProc) spring(line string, tr *trap) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trap != tr || p.trap == nil {
		return false
	}
	p.trap = nil
	tr.fire(line)
	close(tr.fired)
	return true
}

func (t *tortureRun) execute(ctx context.Context, drv driver.Driver, plan []torture.Fault) error {
	nem, err := torture.NewRecorder(filepath.Join(t.hist, "nemesis.jsonl"), "nemesis")
	if err != nil {
		return err
	}
	defer nem.Close()
	t.nem, t.drv = nem, drv
	reader, err := torture.NewRecorder(filepath.Join(t.hist, "reader.jsonl"), "reader")
	if err != nil {
		return err
	}
	defer reader.Close()
	if !engineClock(t.url) {
		reader.WithoutEngineClock()
	}
	if t.barrier, err = torture.OpenBarrier(t.barrierPath); err != nil {
		return err
	}
	defer t.barrier.Close()
	readerBarrier, err := torture.OpenBarrier(t.barrierPath)
	if err != nil {
		return err
	}
	defer readerBarrier.Close()

	start := time.Now()
	t.until = start.Add(t.o.duration)
	t.planned = t.until
	t.pausePending = slices.ContainsFunc(plan, func(f torture.Fault) bool { return f.Kind == torture.FaultPause })
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for slot := range t.o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.supervise(runCtx, slot)
		}()
	}
	readCtx, stopReader := context.WithCancel(ctx)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		torture.RunReader(readCtx, drv, reader, readerBarrier, t.resources, t.o.seed, 50*time.Millisecond)
	}()

	for _, f := range plan {
		if !wait(ctx, time.Until(start.Add(f.At))) {
			break
		}
		t.inject(ctx, f)
	}
	t.settlePause() // an interrupted run
	wait(ctx, time.Until(t.end()))
	// The workers stop by themselves once the duration is over; a generous bound for the last
	// iteration, then they are killed.
	grace := time.AfterFunc(15*time.Second, stop)
	wg.Wait()
	grace.Stop()
	stopReader()
	<-readerDone
	if ctx.Err() != nil {
		_ = nem.Write(torture.Record{Kind: torture.KindEvent, Event: "interrupted", Detail: "the run was interrupted; workers stopped"})
	}
	// The final state; after an interruption too, briefly.
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ad, ok := drv.(*artifactDriver); ok {
		ad.collect(final, t.a.stdout)
	}
	torture.ReadAll(final, drv, reader, t.resources)
	return nil
}

// firstRestoreOnly drops every restore of plan but the first: the control's. A later restore
// would roll the store back to a copy taken after the first, and the leases restored with it
// (etcd, in the histories of the run that failed CI, kept the restored leases alive a TTL and more) would keep the workers out for
// most of what is left of the run, so that the tokens handed out again by the first restore,
// the evidence the control exists for, might never be.
func firstRestoreOnly(plan []torture.Fault) []torture.Fault {
	var out []torture.Fault
	restored := false
	for _, f := range plan {
		if f.Kind == torture.FaultRestore {
			if restored {
				continue
			}
			restored = true
		}
		out = append(out, f)
	}
	return out
}

// wait sleeps for d unless ctx ends first; it reports whether it slept the whole time.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// end is when the workers start no new iteration: until, or while the run's first pause is
// pending, a moment that stays ahead of the clock (pause).
func (t *tortureRun) end() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.endLocked()
}

func (t *tortureRun) endLocked() time.Time {
	if !t.pausePending {
		return t.until
	}
	end := time.Now().Add(awaitBound + time.Second)
	if limit := t.pauseLimit(); end.After(limit) {
		end = limit
	}
	if end.Before(t.until) {
		return t.until
	}
	return end
}

// pauseLimit is how long the run waits for its first pause: one more --duration past the
// planned end, and at least 30 s.
func (t *tortureRun) pauseLimit() time.Time {
	return t.planned.Add(max(t.o.duration, 30*time.Second))
}

// settlePause ends the wait for the run's first pause: it landed, or the nemesis gave up. The
// run's end stays where it was and is recorded when it went past the one planned.
func (t *tortureRun) settlePause() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.pausePending {
		return
	}
	t.until = t.endLocked()
	t.pausePending = false
	if over := t.until.Sub(t.planned); over > 0 {
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "extend",
			Detail: fmt.Sprintf("the workers went on %s past the planned end, until the run's first pause had landed", over.Round(time.Millisecond))})
	}
}

// supervise keeps a worker process running in slot until the run is over, starting a new
// process, with a new identity, whenever one dies (killed by the nemesis or failing) or ends
// before the run does (the run was extended for its first pause).
func (t *tortureRun) supervise(ctx context.Context, slot int) {
	for incarnation := 1; ; incarnation++ {
		remaining := time.Until(t.end())
		if remaining < torture.TTLMin || ctx.Err() != nil {
			return
		}
		p, err := t.startWorker(ctx, slot, incarnation, remaining)
		if err != nil {
			_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "exit", Slot: slot, Detail: err.Error()})
			wait(ctx, 200*time.Millisecond)
			continue
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			_ = contProcess(p.cmd.Process)
			_ = p.cmd.Process.Kill()
			<-p.done
			return
		}
		if code := p.cmd.ProcessState.ExitCode(); code > 0 {
			wait(ctx, 200*time.Millisecond) // failed (e.g. the database was restarting): try again
		}
	}
}

func (t *tortureRun) startWorker(ctx context.Context, slot, incarnation int, remaining time.Duration) (*tortureProc, error) {
	name := fmt.Sprintf("w%d.%d", slot+1, incarnation)
	args := []string{"torture-worker", "--proc", name,
		"--seed", strconv.FormatUint(torture.WorkerSeed(t.o.seed, (slot+1)*1000+incarnation), 10),
		"--resources", strings.Join(t.resources, ","),
		"--history", filepath.Join(t.hist, name+".jsonl"),
		"--duration", remaining.String(),
		"--barrier", t.barrierPath}
	if contains(t.faults, torture.FaultDropReply) {
		args = append(args, "--drop-reply", strconv.FormatFloat(torture.DropReply, 'f', -1, 64))
	}
	if t.o.unfenced {
		args = append(args, "--naive")
	}
	if t.gateURL != "" {
		args = append(args, "--gate", t.gateURL)
		if !t.o.unfenced {
			args = append(args, "--gate-fence")
		}
	}
	if len(t.azureArgs) > 0 {
		args = append(args, t.azureArgs...)
		if !t.o.unfenced {
			args = append(args, "--gate-fence")
		}
	}
	if t.o.mutant != "" {
		args = append(args, "--mutant", t.o.mutant)
	}
	if t.o.shortBuilds {
		args = append(args, "--short-builds")
	}
	if t.storeURL != "" {
		args = append(args, "--artifact-store", t.storeURL)
	}
	if !engineClock(t.url) {
		args = append(args, "--no-engine-clock")
	}
	hold := t.nets != nil && contains(t.faults, torture.FaultIsolate)
	if hold {
		args = append(args, "--hold")
	}
	if t.clockFile != "" {
		args = append(args, "--clock-file", t.clockFile)
	}
	// The URL goes through the environment, not the command line, where ps would show a password.
	cmd := t.nets.command(slot, t.exe, args)
	cmd.Env = append(os.Environ(), "FENCED_DB="+t.workerURL)
	cmd.SysProcAttr = workerProcAttr()
	stderr, err := os.Create(filepath.Join(t.hist, name+".stderr"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = stderr.Close()
		return nil, err
	}
	var control io.WriteCloser
	if hold {
		if control, err = cmd.StdinPipe(); err != nil {
			_ = stderr.Close()
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		_ = stderr.Close()
		return nil, fmt.Errorf("start worker %s: %w", name, err)
	}
	p := &tortureProc{slot: slot, name: name, cmd: cmd, done: make(chan struct{}), control: control}
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "start", Slot: slot, Pid: cmd.Process.Pid, Detail: name})
	t.mu.Lock()
	t.procs[slot] = p
	t.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if hold {
				t.sawBuild(sc.Text())
			}
			p.mu.Lock()
			tr := p.trap
			p.mu.Unlock()
			if tr != nil && strings.HasPrefix(sc.Text(), tr.prefix) {
				p.spring(sc.Text(), tr)
			}
		}
		err := cmd.Wait()
		_ = stderr.Close()
		detail := "exited 0"
		if err != nil {
			detail = err.Error()
		}
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "exit", Proc: name, Slot: slot, Detail: name + " " + detail})
		close(p.done)
	}()
	return p, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// inject carries out one planned fault and records it.
func (t *tortureRun) inject(ctx context.Context, f torture.Fault) {
	t.mu.Lock()
	p := t.procs[f.Slot]
	t.mu.Unlock()
	switch f.Kind {
	case torture.FaultPause:
		t.pause(ctx, f)
	case torture.FaultKill:
		if p == nil {
			return
		}
		var killed int64
		detail := "untargeted: no operation was reported within 3s"
		tr := p.setTrap("call ", func(line string) {
			if p.cmd.Process.Kill() == nil {
				killed = torture.Now()
				detail = "during a " + strings.TrimPrefix(line, "call ") + " request"
			}
		})
		if !t.await(ctx, p, tr) {
			if p.cmd.Process.Kill() == nil {
				killed = torture.Now()
			}
		}
		if killed != 0 {
			_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultKill, Proc: p.name, Slot: f.Slot, Time: killed, Detail: detail})
		}
	case torture.FaultRestart:
		t.restartFault(ctx)
	case torture.FaultRowLock:
		t.holdRowLock(ctx, f)
	case torture.FaultBump:
		_, _ = t.bump(ctx) // recorded with its outcome; the report counts a failed one apart
	case torture.FaultPartition:
		t.partition(ctx, f)
	case torture.FaultLoss:
		t.loss(ctx, f)
	case torture.FaultIsolate:
		t.isolate(ctx, f)
	case torture.FaultRestore:
		t.restoreFault(ctx, f)
	case torture.FaultDelay:
		t.delay(ctx, f)
	case torture.FaultClock:
		us := f.OffsetMs * 1000
		if err := os.WriteFile(t.clockFile, []byte(strconv.FormatInt(us, 10)+"\n"), 0o644); err != nil {
			_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "error", Detail: err.Error()})
			return
		}
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultClock, OffsetMs: f.OffsetMs,
			Detail: fmt.Sprintf("database clock offset %+dms", f.OffsetMs)})
	}
}

// pause is the pause fault: slot f.Slot's worker is stopped (SIGSTOP) the moment it reports a
// build, for f.For. A pause whose worker reports no build within awaitBound (still starting on
// a loaded machine, killed, or waiting on the database) is dropped, unless it is the run's
// first: that one goes to the next slots in turn until one builds. Until it has landed the run
// is not over (end keeps ahead of the clock, and supervise replaces the workers that reach
// their end), so that a run with the pause fault injects at least one however late the
// workers get going. The run goes on at most until pauseLimit; workers that build nothing for
// that long leave it without a pause.
func (t *tortureRun) pause(ctx context.Context, f torture.Fault) {
	for slot := f.Slot; ; slot = (slot + 1) % t.o.workers {
		t.mu.Lock()
		p, first := t.procs[slot], t.pausePending
		t.mu.Unlock()
		if p != nil && t.pauseProc(ctx, p, f) {
			return
		}
		if !first || ctx.Err() != nil || !time.Now().Before(t.pauseLimit()) {
			t.settlePause()
			return
		}
		wait(ctx, 100*time.Millisecond) // a slot with no process yet, or one that just exited
	}
}

// pauseProc stops p at its next build for f.For; it reports whether it did.
func (t *tortureRun) pauseProc(ctx context.Context, p *tortureProc, f torture.Fault) bool {
	var stopped int64
	tr := p.setTrap("build", func(string) {
		if stopProcess(p.cmd.Process) == nil {
			stopped = torture.Now()
		}
	})
	t.await(ctx, p, tr)
	if stopped == 0 {
		return false // the process was gone, or built nothing in time
	}
	t.settlePause()
	wait(ctx, f.For)
	_ = contProcess(p.cmd.Process)
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultPause, Proc: p.name, Slot: p.slot,
		Time: stopped, EndTime: torture.Now(), Detail: fmt.Sprintf("SIGSTOP while building, for %s", f.For)})
	return true
}

// awaitBound is how long await waits for a worker to report the phase a fault aims at.
const awaitBound = 3 * time.Second

// await waits up to awaitBound for the trap to fire, then disarms it; it reports whether it fired.
func (t *tortureRun) await(ctx context.Context, p *tortureProc, tr *trap) bool {
	timer := time.NewTimer(awaitBound)
	defer timer.Stop()
	select {
	case <-tr.fired:
		return true
	case <-p.done:
	case <-timer.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trap == tr {
		p.trap = nil
		return false
	}
	<-tr.fired // it fired meanwhile
	return true
}

// tortureWorkerCmd is a worker process of fenced torture (hidden).
func (a *app) tortureWorkerCmd() *cobra.Command {
	var (
		cfg                                                     torture.WorkerConfig
		resources, history, clockFile, seedStr, barrier, mutant string
		noClock, naive, gateFence, hold                         bool
		gateURL, storeURL                                       string
		az                                                      tortureAzureWorker
	)
	cmd := &cobra.Command{
		Use:    "torture-worker",
		Short:  "A worker process of fenced torture (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			seed, err := strconv.ParseUint(seedStr, 10, 64)
			if err != nil {
				return usagef("invalid --seed %q", seedStr)
			}
			cfg.Seed, cfg.Resources, cfg.TTLMin, cfg.TTLMax, cfg.Phase = seed, strings.Split(resources, ","), torture.TTLMin, torture.TTLMax, a.stdout
			drv, err := openTorture(cmd.Context(), a.dbURL(cmd), clockFile)
			if err != nil {
				return err
			}
			defer drv.Close()
			if storeURL != "" {
				if drv, err = workerArtifacts(cmd.Context(), drv, storeURL, mutant); err != nil {
					return err
				}
			} else if drv, err = mutate(drv, mutant); err != nil {
				return err
			}
			// The renewal mutant shows only where renewals come after a pause: every lease is renewed.
			cfg.RenewAlways = mutant == mutantRenewAfterExpiry
			if naive {
				if cfg.Naive, err = naiveWrite(drv); err != nil {
					return err
				}
			}
			if gateURL != "" {
				cfg.Gate = &torture.GateConfig{URL: gateURL, Fence: gateFence}
			}
			if az.url != "" {
				if cfg.Gate, err = az.config(gateFence); err != nil {
					return err
				}
			}
			rec, err := torture.NewRecorder(history, cfg.Proc)
			if err != nil {
				return err
			}
			defer rec.Close()
			if noClock {
				rec.WithoutEngineClock()
			}
			if barrier != "" {
				if cfg.Barrier, err = torture.OpenBarrier(barrier); err != nil {
					return err
				}
				defer cfg.Barrier.Close()
			}
			if hold {
				cfg.Hold = torture.NewHold(a.stdin)
			}
			return torture.RunWorker(cmd.Context(), cfg, drv, rec)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Proc, "proc", "", "identity in the history")
	f.StringVar(&seedStr, "seed", "", "the worker's seed")
	f.StringVar(&resources, "resources", "", "comma-separated resources")
	f.StringVar(&history, "history", "", "history file")
	f.DurationVar(&cfg.Duration, "duration", 0, "start no iteration after this")
	f.Float64Var(&cfg.DropReply, "drop-reply", 0, "probability of dropping a reply")
	f.BoolVar(&naive, "naive", false, "write unconditionally, as a plain lock would")
	f.StringVar(&clockFile, "clock-file", "", "SQLite clock offset file")
	f.StringVar(&gateURL, "gate", "", "participating service to write through")
	f.BoolVar(&gateFence, "gate-fence", false, "fence the service (or the Azure blob) right after acquiring")
	az.flags(f)
	f.StringVar(&barrier, "barrier", "", "barrier file, held shared by each request")
	f.StringVar(&storeURL, "artifact-store", "", "publish through artifacts in this store")
	f.StringVar(&mutant, "mutant", "", "a planted bug (tests only)")
	f.BoolVar(&cfg.ShortBuilds, "short-builds", false, "keep every build within 3% of the lease's TTL")
	f.BoolVar(&noClock, "no-engine-clock", false, "leave the engine's clock out of the history")
	f.BoolVar(&hold, "hold", false, "take the nemesis's hold requests on stdin (the isolate fault)")
	return cmd
}
