package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination/artifact"
)

// The demo's schedule. Worker A's lease is short so that the demo is quick; it is paused far
// longer than that, as a stop-the-world pause, a swapped-out VM or a slow disk would.
const (
	demoResource = "nightly-report"
	demoTTLA     = time.Second
	demoTTLB     = 10 * time.Second
	demoStep     = 15 * time.Second // the longest any one step of the schedule may take
	demoPoll     = 10 * time.Millisecond
)

func (a *app) demoCmd() *cobra.Command {
	var dest, azure string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show, with real processes, a paused worker's stale write refused (and a plain lock losing it)",
		Long: `Run the schedule that makes a lock unsafe, with real worker processes on a temporary
SQLite database (removed afterwards; --db is ignored), three times:

  1. Worker A acquires the lease (ttl 1s) and starts a long build.
  2. A is suspended with SIGSTOP, longer than its lease.
  3. Once the database says A's lease has expired, worker B acquires, publishes
     "report by B" and releases.
  4. A is resumed with SIGCONT and publishes "report by A" with its old lease.

With fenced, the database refuses A's publication (A exits 5) and B's result stays. With a
naive lock (the same acquisition, then an unconditional UPDATE), A overwrites B's result.
The third run is fenced with the report as an artifact in a file store: A uploads before its
pause, its pointer is refused, get returns B's artifact, and gc deletes A's orphan.
The demo exits 0 only when both fenced runs kept B's result and the naive run lost it.

With --destination gate the workers write to a participating service instead (a gate on its
own SQLite database, served on loopback by the demo), and B builds for a while before writing:
run 1 has both workers fence the service on acquisition, and the service itself refuses A's
stale write; run 2 does not fence, and the service accepts it while B owns the resource.

With --destination azure the workers write a blob that readers read in place, at the Azure
Blob endpoint --azure URL, else $FENCED_AZURE, else Azurite on its default address (the demo
says so and skips when none answers): run 1 takes the blob over on acquisition
(destination/azureblob's Leased), and Azure itself refuses A's stale upload; run 2 uploads
plainly under the lock alone, and A's report overwrites the blob while B owns the resource.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			switch dest {
			case "row":
				return a.demo(cmd.Context())
			case "gate":
				return a.demoGate(cmd.Context())
			case "azure":
				return a.demoAzure(cmd.Context(), azure)
			}
			return usagef("invalid --destination %q: want row, gate or azure", dest)
		}),
	}
	demoDestinationFlag(cmd, &dest, &azure)
	return cmd
}

func (a *app) demo(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := os.MkdirTemp("", "fenced-demo-")
	if err != nil {
		return fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(a.stdout, "fenced demo: two worker processes, one resource %q, SQLite in %s\n", demoResource, dir)
	fmt.Fprintf(a.stdout, "Worker A is paused with SIGSTOP past its %s lease; meanwhile worker B takes over.\n", demoTTLA)

	fmt.Fprintf(a.stdout, "\n== Run 1: fenced (every write carries the lease's generation; the database checks it) ==\n")
	fencedPayload, err := a.demoRun(ctx, exe, filepath.Join(dir, "fenced.db"), false, "")
	if err != nil {
		return fmt.Errorf("the fenced run failed: %w", err)
	}
	fmt.Fprintf(a.stdout, "\n== Run 2: naive lock (the same acquisition, then an unconditional UPDATE) ==\n")
	naivePayload, err := a.demoRun(ctx, exe, filepath.Join(dir, "naive.db"), true, "")
	if err != nil {
		return fmt.Errorf("the naive run failed: %w", err)
	}
	fmt.Fprintf(a.stdout, "\n== Run 3: fenced, the report an artifact in a file store and only its pointer in the database ==\n")
	artifactPayload, err := a.demoRun(ctx, exe, filepath.Join(dir, "artifact.db"), false, artifact.FileURL(filepath.Join(dir, "artifacts")))
	if err != nil {
		return fmt.Errorf("the artifact run failed: %w", err)
	}

	fmt.Fprintln(a.stdout)
	switch {
	case fencedPayload != payloadB:
		return fmt.Errorf("the fenced run did not keep B's result: the final payload is %q", fencedPayload)
	case naivePayload == payloadB:
		return fmt.Errorf("the naive run kept B's result, so the schedule did not reproduce the lost write")
	case artifactPayload != payloadB:
		return fmt.Errorf("the artifact run did not keep B's artifact: get returned %q", artifactPayload)
	}
	fmt.Fprintln(a.stdout, "Result: with fenced the stale write was refused and B's result kept; with the naive lock A overwrote it;")
	fmt.Fprintln(a.stdout, "with an artifact, A's pointer was refused, readers got B's bytes, and A's orphan was collected.")
	return nil
}

const (
	payloadA = "report by A"
	payloadB = "report by B"
)

// demoRun runs the schedule once on a fresh database file and returns the final payload. With
// store, the workers publish artifacts there, and the final payload is the artifact read back.
func (a *app) demoRun(ctx context.Context, exe, path string, naive bool, store string) (string, error) {
	start := time.Now()
	say := func(actor, format string, args ...any) {
		elapsed := fmt.Sprintf("+%.3fs", time.Since(start).Seconds())
		fmt.Fprintf(a.stdout, "  %8s  %-4s  %s\n", elapsed, actor, fmt.Sprintf(format, args...))
	}
	drv, err := sqlite.Open(path)
	if err != nil {
		return "", err
	}
	s, err := fenced.New(ctx, drv, nil)
	if err != nil {
		_ = drv.Close()
		return "", err
	}
	defer s.Close()
	if err := s.Provision(ctx, demoResource); err != nil {
		return "", err
	}
	url := "sqlite:" + path
	write := "published"
	if naive {
		write = "wrote (unconditionally)"
	}

	// 1. A acquires and reports, then waits for "go": its long build.
	wa, err := startWorker(ctx, exe, url, "A", demoTTLA, payloadA, naive, true, storeArgs(store)...)
	if err != nil {
		return "", err
	}
	defer wa.cleanup()
	ev, err := wa.expect("acquired")
	if err != nil {
		return "", err
	}
	genA := ev.Generation
	say("A", "acquired generation %d (owner %s), lease until %s on the database's clock; starts a long build",
		genA, short(ev.Owner), clock(ev.LeaseUntil))
	if store != "" {
		if ev, err = wa.expect("uploaded"); err != nil {
			return "", err
		}
		say("A", "uploaded its report, %d bytes, as the artifact %s; its pointer is not published yet", ev.Bytes, ev.Key)
	}

	// 2. A is suspended.
	if err := stopProcess(wa.cmd.Process); err != nil {
		return "", fmt.Errorf("suspend worker A: %w", err)
	}
	say("demo", "SIGSTOP A (pid %d): a pause longer than its lease", wa.cmd.Process.Pid)

	// 3. Wait until the database, not this process's clock, says A's lease is over.
	st, err := waitExpired(ctx, s, genA)
	if err != nil {
		return "", err
	}
	say("demo", "the database says A's lease expired at %s (database now %s)",
		clock(timeJSON(st.LeaseUntil)), clock(timeJSON(st.Now)))

	// B takes over, publishes and releases.
	wb, err := startWorker(ctx, exe, url, "B", demoTTLB, payloadB, naive, false, storeArgs(store)...)
	if err != nil {
		return "", err
	}
	defer wb.cleanup()
	ev, err = wb.expect("acquired")
	if err != nil {
		return "", err
	}
	say("B", "acquired generation %d (owner %s)", ev.Generation, short(ev.Owner))
	if _, err := wb.expect("published"); err != nil {
		return "", err
	}
	if store != "" {
		say("B", "uploaded %q as an artifact and published its pointer with generation %d: ACCEPTED", payloadB, ev.Generation)
	} else {
		say("B", "%s %q with generation %d: ACCEPTED", write, payloadB, ev.Generation)
	}
	if _, err := wb.expect("released"); err != nil {
		return "", err
	}
	say("B", "released generation %d and exited", ev.Generation)
	if code := wb.wait(); code != ExitOK {
		return "", fmt.Errorf("worker B exited with code %d: %s", code, wb.stderrText())
	}

	// 4. A resumes and publishes with its old lease.
	if err := contProcess(wa.cmd.Process); err != nil {
		return "", fmt.Errorf("resume worker A: %w", err)
	}
	say("demo", "SIGCONT A; its build finishes and it publishes with generation %d", genA)
	if err := wa.send("go"); err != nil {
		return "", err
	}
	ev, err = wa.expect("published", "refused")
	if err != nil {
		return "", err
	}
	if store != "" {
		write = "published the pointer to its artifact"
	}
	if ev.Event == "refused" {
		say("A", "%s %q with generation %d: REFUSED by the database (%s)", write, payloadA, genA, ev.Reason)
	} else {
		say("A", "%s %q with generation %d: ACCEPTED", write, payloadA, genA)
	}
	code := wa.wait()
	say("A", "exited with code %d", code)

	if store != "" {
		return a.demoArtifactEnd(ctx, s, store, say)
	}
	payload, gen, err := s.Get(ctx, demoResource)
	if err != nil {
		return "", err
	}
	verdict := "B's result was kept"
	if string(payload) != payloadB {
		verdict = "B's result was LOST, overwritten by the paused worker"
	}
	say("demo", "final payload %q (published generation %d): %s", payload, gen, verdict)
	return string(payload), nil
}

// storeArgs are a demo worker's arguments for an artifact store, none without one.
func storeArgs(store string) []string {
	if store == "" {
		return nil
	}
	return []string{"--store", store}
}

// demoArtifactEnd reads the published artifact back through its pointer, then collects A's
// orphan, and returns what was read.
func (a *app) demoArtifactEnd(ctx context.Context, s *fenced.Store, store string, say func(actor, format string, args ...any)) (string, error) {
	b, err := artifact.OpenBucket(ctx, store)
	if err != nil {
		return "", err
	}
	defer b.Close()
	r, err := artifact.Open(ctx, s, b, demoResource)
	if err != nil {
		return "", err
	}
	defer r.Close()
	var got bytes.Buffer
	if _, err := r.WriteTo(&got); err != nil {
		return "", err
	}
	verdict := "B's artifact was kept"
	if got.String() != payloadB {
		verdict = "B's artifact was LOST"
	}
	say("demo", "get follows the pointer of generation %d to %s: %q, size and SHA-256 verified: %s",
		r.Generation, r.Pointer.Key, got.String(), verdict)
	rep, err := artifact.Collect(ctx, s, b, 0, false)
	if err != nil {
		return "", err
	}
	for _, c := range rep.Deleted {
		say("demo", "gc deleted the orphan of generation %d, %s (%d bytes): no pointer names it and its lease can never publish", c.Token.Generation, c.Key, c.Size)
	}
	say("demo", "gc kept %d artifact(s), the published one", rep.Kept)
	return got.String(), nil
}

// waitExpired polls the database until generation gen's lease is no longer held on its clock.
func waitExpired(ctx context.Context, s *fenced.Store, gen int64) (fenced.State, error) {
	ctx, cancel := context.WithTimeout(ctx, demoTTLA+demoStep)
	defer cancel()
	t := time.NewTicker(demoPoll)
	defer t.Stop()
	for {
		st, err := s.Show(ctx, demoResource)
		if err != nil {
			return st, err
		}
		if st.Generation != gen {
			return st, fmt.Errorf("generation %d was superseded by %d before the demo let anyone acquire", gen, st.Generation)
		}
		if !st.Held() {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("wait for A's lease to expire: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// short abbreviates an owner identity for the timeline.
func short(owner string) string {
	if len(owner) > 8 {
		return owner[:8] + "…"
	}
	return owner
}

// clock shows the time of day of an RFC 3339 database time.
func clock(t *string) string {
	if t == nil {
		return "never"
	}
	v, err := time.Parse(time.RFC3339Nano, *t)
	if err != nil {
		return *t
	}
	return v.Format("15:04:05.000 MST")
}

// workerEvent is one line a demo worker prints on its stdout.
type workerEvent struct {
	Event      string  `json:"event"`
	Generation int64   `json:"generation,omitempty"`
	Owner      string  `json:"owner,omitempty"`
	LeaseUntil *string `json:"lease_until,omitempty"`
	Reason     string  `json:"reason,omitempty"`
	Token      string  `json:"token,omitempty"`
	Key        string  `json:"key,omitempty"`   // an uploaded artifact's key
	Bytes      int64   `json:"bytes,omitempty"` // and its size
}

// worker is one demo-worker process seen from the demo. Only the demo's goroutine uses it.
type worker struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer // read only after wait
	done   bool
	code   int
}

func startWorker(ctx context.Context, exe, url, name string, ttl time.Duration, payload string, naive, waitGo bool, extra ...string) (*worker, error) {
	args := append([]string{"demo-worker", "--db", url, "--name", name, "--ttl", ttl.String(), "--payload", payload}, extra...)
	if naive {
		args = append(args, "--naive")
	}
	if waitGo {
		args = append(args, "--wait")
	} else {
		args = append(args, "--release")
	}
	w := &worker{name: name, cmd: exec.CommandContext(ctx, exe, args...), lines: make(chan string, 16)}
	w.cmd.Stderr = &w.stderr
	w.cmd.SysProcAttr = workerProcAttr()
	var err error
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", name, err)
	}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text() // never blocks: a worker prints at most a few lines
		}
	}()
	return w, nil
}

// expect reads the worker's next event, which must be one of events.
func (w *worker) expect(events ...string) (workerEvent, error) {
	timer := time.NewTimer(demoStep)
	defer timer.Stop()
	var line string
	select {
	case l, ok := <-w.lines:
		if !ok {
			code := w.wait()
			return workerEvent{}, fmt.Errorf("worker %s exited with code %d before reporting %s: %s",
				w.name, code, strings.Join(events, " or "), w.stderrText())
		}
		line = l
	case <-timer.C:
		w.cleanup()
		return workerEvent{}, fmt.Errorf("worker %s did not report %s within %s", w.name, strings.Join(events, " or "), demoStep)
	}
	var ev workerEvent
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		return ev, fmt.Errorf("worker %s printed %q: %w", w.name, line, err)
	}
	for _, e := range events {
		if ev.Event == e {
			return ev, nil
		}
	}
	return ev, fmt.Errorf("worker %s reported %q where %s was expected", w.name, ev.Event, strings.Join(events, " or "))
}

func (w *worker) send(line string) error {
	if _, err := io.WriteString(w.stdin, line+"\n"); err != nil {
		return fmt.Errorf("write to worker %s: %w", w.name, err)
	}
	return nil
}

// wait waits for the worker to exit and returns its exit code (-1 if it was killed).
func (w *worker) wait() int {
	if w.done {
		return w.code
	}
	_ = w.stdin.Close()
	for range w.lines { // Wait must not run before the output is read to the end
	}
	err := w.cmd.Wait()
	w.done = true
	var exit *exec.ExitError
	switch {
	case err == nil:
		w.code = 0
	case errors.As(err, &exit):
		w.code = exit.ExitCode()
	default:
		w.code = -1
	}
	return w.code
}

// cleanup kills the worker if it is still running (a suspended one too) and reaps it. Every
// path out of the demo runs it, so that no worker outlives the demo.
func (w *worker) cleanup() {
	if w.done {
		return
	}
	_ = w.cmd.Process.Kill()
	w.wait()
}

func (w *worker) stderrText() string {
	if !w.done {
		return "(still running)"
	}
	if s := strings.TrimSpace(w.stderr.String()); s != "" {
		return s
	}
	return "(no message)"
}

// demoWorkerCmd is the worker process the demo starts: it acquires, optionally waits for "go"
// on stdin (its long build), publishes or writes, and reports each step as a JSON line.
func (a *app) demoWorkerCmd() *cobra.Command {
	var (
		name, ttl, payload, service, store string
		naive, wait, release, fence        bool
		az                                 demoAzureWorkerFlags
	)
	cmd := &cobra.Command{
		Use:    "demo-worker",
		Short:  "A worker process of the demo (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			d, err := parseTTL(ttl)
			if err != nil {
				return err
			}
			if service != "" {
				return a.demoServiceWorker(cmd, service, d, []byte(payload), fence, wait)
			}
			if az.url != "" {
				return a.demoAzureWorker(cmd, az, d, []byte(payload), fence, wait)
			}
			if store != "" {
				return a.demoArtifactWorker(cmd, name, d, []byte(payload), wait, release, store)
			}
			return a.demoWorker(cmd, name, d, []byte(payload), naive, wait, release)
		}),
	}
	cmd.Flags().StringVar(&name, "name", "", "worker name")
	cmd.Flags().StringVar(&ttl, "ttl", "", "lease ttl")
	cmd.Flags().StringVar(&payload, "payload", "", "what to publish")
	cmd.Flags().BoolVar(&naive, "naive", false, "write unconditionally, as a plain lock would")
	cmd.Flags().BoolVar(&wait, "wait", false, `wait for "go" on stdin before publishing`)
	cmd.Flags().BoolVar(&release, "release", false, "release after publishing")
	cmd.Flags().StringVar(&service, "service", "", "write to this participating service instead of publishing")
	cmd.Flags().BoolVar(&fence, "fence", false, "fence the service right after acquiring")
	cmd.Flags().StringVar(&store, "store", "", "publish the payload as an artifact in this store")
	az.add(cmd)
	return cmd
}

func (a *app) demoWorker(cmd *cobra.Command, name string, ttl time.Duration, payload []byte, naive, wait, release bool) error {
	ctx := cmd.Context()
	s, err := a.open(cmd)
	if err != nil {
		return err
	}
	defer s.Close()
	lease, err := s.Acquire(ctx, demoResource, ttl)
	if err != nil {
		return err
	}
	if err := a.print(workerEvent{Event: "acquired", Generation: lease.Generation(), Owner: lease.Owner(),
		LeaseUntil: timeJSON(lease.LeaseUntil())}); err != nil {
		return err
	}
	if wait {
		line, err := bufio.NewReader(a.stdin).ReadString('\n')
		if strings.TrimSpace(line) != "go" {
			return fmt.Errorf("worker %s: expected \"go\" on standard input: %v", name, err)
		}
	}
	// The worker publishes without consulting its local trust window (lease.Done), as a process
	// that has not yet noticed its pause would: the database's check is what stands between
	// its stale write and B's result.
	if naive {
		db, ok := s.Driver().(*sqlite.Driver)
		if !ok {
			return fmt.Errorf("worker %s: the naive write needs the SQLite backend", name)
		}
		// The lock was taken, so the write is trusted: nothing in it checks the lease.
		if _, err := db.DB().ExecContext(ctx, `UPDATE fenced_resources
			SET payload = ?, published_generation = ?, published_at = CAST(unixepoch('subsec') * 1000000 AS INTEGER)
			WHERE resource = ?`, payload, lease.Generation(), demoResource); err != nil {
			return fmt.Errorf("write payload: %w", err)
		}
	} else if err := lease.Publish(ctx, payload); err != nil {
		var refused *fenced.RefusedError
		if errors.As(err, &refused) {
			reason := fmt.Sprintf("cause %s", refused.Cause)
			if refused.Cause == fenced.CauseSuperseded {
				reason = fmt.Sprintf("generation %d was superseded by generation %d", refused.Generation, refused.CurrentGeneration)
			}
			_ = a.print(workerEvent{Event: "refused", Generation: lease.Generation(), Reason: reason})
		}
		return err
	}
	if err := a.print(workerEvent{Event: "published", Generation: lease.Generation()}); err != nil {
		return err
	}
	if release {
		if err := lease.Release(ctx); err != nil {
			return err
		}
		return a.print(workerEvent{Event: "released", Generation: lease.Generation()})
	}
	return nil
}

// demoArtifactWorker is demoWorker with the payload as an artifact: it uploads right after
// acquiring, before its long build ends, and publishes the pointer afterwards.
func (a *app) demoArtifactWorker(cmd *cobra.Command, name string, ttl time.Duration, payload []byte, wait, release bool, store string) error {
	ctx := cmd.Context()
	b, err := artifact.OpenBucket(ctx, store)
	if err != nil {
		return err
	}
	defer b.Close()
	s, err := a.open(cmd)
	if err != nil {
		return err
	}
	defer s.Close()
	lease, err := s.Acquire(ctx, demoResource, ttl)
	if err != nil {
		return err
	}
	if err := a.print(workerEvent{Event: "acquired", Generation: lease.Generation(), Owner: lease.Owner(),
		LeaseUntil: timeJSON(lease.LeaseUntil())}); err != nil {
		return err
	}
	p, err := artifact.Upload(ctx, lease, b, bytes.NewReader(payload), artifact.WithContentType("text/plain"))
	if err != nil {
		return err
	}
	if wait {
		if err := a.print(workerEvent{Event: "uploaded", Generation: lease.Generation(), Key: p.Key, Bytes: p.Size}); err != nil {
			return err
		}
		line, err := bufio.NewReader(a.stdin).ReadString('\n')
		if strings.TrimSpace(line) != "go" {
			return fmt.Errorf("worker %s: expected \"go\" on standard input: %v", name, err)
		}
	}
	if err := artifact.PublishPointer(ctx, lease, p); err != nil {
		var refused *fenced.RefusedError
		if errors.As(err, &refused) {
			reason := fmt.Sprintf("cause %s", refused.Cause)
			if refused.Cause == fenced.CauseSuperseded {
				reason = fmt.Sprintf("generation %d was superseded by generation %d", refused.Generation, refused.CurrentGeneration)
			}
			_ = a.print(workerEvent{Event: "refused", Generation: lease.Generation(), Reason: reason})
		}
		return err
	}
	if err := a.print(workerEvent{Event: "published", Generation: lease.Generation()}); err != nil {
		return err
	}
	if release {
		if err := lease.Release(ctx); err != nil {
			return err
		}
		return a.print(workerEvent{Event: "released", Generation: lease.Generation()})
	}
	return nil
}
