package cli

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/gate"
)

// demoGate runs the paused-writer schedule against a participating service (a gate on its own
// SQLite database, served on loopback by this process), once with the workers fencing the
// service on acquisition and once without.
func (a *app) demoGate(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := os.MkdirTemp("", "fenced-demo-")
	if err != nil {
		return fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(a.stdout, "fenced demo --destination gate: two worker processes write resource %q to a service\n", demoResource)
	fmt.Fprintf(a.stdout, "that keeps a high-water mark per resource (destination/gate); files in %s.\n", dir)
	fmt.Fprintf(a.stdout, "Worker A is paused with SIGSTOP past its %s lease; meanwhile worker B takes over and builds.\n", demoTTLA)

	fmt.Fprintf(a.stdout, "\n== Run 1: the workers fence the service right after acquiring ==\n")
	fencedAccepted, err := a.demoGateRun(ctx, exe, filepath.Join(dir, "fenced"), true)
	if err != nil {
		return fmt.Errorf("the fenced run failed: %w", err)
	}
	fmt.Fprintf(a.stdout, "\n== Run 2: the same service, without fencing on acquisition (the high-water mark alone) ==\n")
	plainAccepted, err := a.demoGateRun(ctx, exe, filepath.Join(dir, "plain"), false)
	if err != nil {
		return fmt.Errorf("the run without fencing failed: %w", err)
	}
	fmt.Fprintln(a.stdout)
	switch {
	case fencedAccepted:
		return errors.New("the service accepted A's stale write although B had fenced it")
	case !plainAccepted:
		return errors.New("without fencing the service refused A's stale write, so the schedule did not show the gap")
	}
	fmt.Fprintln(a.stdout, "Result: fenced on acquisition, the service itself refused the stale write; without it, the service")
	fmt.Fprintln(a.stdout, "accepted a write from a worker that no longer owned the resource, and readers saw it.")
	return nil
}

// demoService is the participating service of the demo: one report per resource.
type demoService struct {
	db  *sql.DB
	srv *http.Server
	url string
}

func startDemoService(path string) (*demoService, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	g, err := gate.New(db, gate.SQLite, nil)
	if err == nil {
		err = g.Migrate(ctx)
	}
	if err == nil {
		err = g.Add(ctx, demoResource)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE reports (resource TEXT PRIMARY KEY, body BLOB NOT NULL, token TEXT NOT NULL)`)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("set up the demo service: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /fence", g.FenceHandler())
	mux.Handle("PUT /report", g.Handler(func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		resource, token, _ := gate.TokenFrom(r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(r.Context(), `INSERT INTO reports VALUES (?1, ?2, ?3)
			ON CONFLICT (resource) DO UPDATE SET body = excluded.body, token = excluded.token`, resource, body, token.String())
		return err
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &demoService{db: db, srv: &http.Server{Handler: mux, ReadHeaderTimeout: demoStep}, url: "http://" + ln.Addr().String()}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *demoService) close() {
	_ = s.srv.Close()
	_ = s.db.Close()
}

func (s *demoService) report(ctx context.Context) (body, token string) {
	_ = s.db.QueryRowContext(ctx, `SELECT body, token FROM reports WHERE resource = ?1`, demoResource).Scan(&body, &token)
	return body, token
}

// demoGateRun runs the schedule once and reports whether the service accepted A's stale write.
func (a *app) demoGateRun(ctx context.Context, exe, dir string, fence bool) (bool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	svc, err := startDemoService(filepath.Join(dir, "service.db"))
	if err != nil {
		return false, err
	}
	defer svc.close()
	return a.demoDestinationRun(ctx, exe, dir, fence, demoTarget{
		args:     []string{"--service", svc.url},
		fenced:   func(tok string) string { return "fenced the service: its mark is now " + tok },
		unfenced: func(tok string) string { return "does not fence: the service has not heard of token " + tok },
		accepted: "the service ACCEPTED A's write (204)",
		refused:  "the service REFUSED A's write (409: %s)",
		wrote:    "(204)",
		readers:  "readers of the service",
		read:     svc.report,
	})
}

// demoTarget is where the demo's workers write, and how the demo tells of it.
type demoTarget struct {
	args              []string // the workers' arguments naming the destination
	fenced, unfenced  func(token string) string
	accepted, refused string // refused has one %s: the refusal's reason
	wrote             string // after B's write
	readers           string // who reads the destination
	read              func(ctx context.Context) (body, token string)
}

// demoDestinationRun runs the paused-writer schedule once against t and reports whether A's
// stale write was accepted.
func (a *app) demoDestinationRun(ctx context.Context, exe, dir string, fence bool, t demoTarget) (bool, error) {
	start := time.Now()
	say := func(actor, format string, args ...any) {
		fmt.Fprintf(a.stdout, "  %8s  %-4s  %s\n", fmt.Sprintf("+%.3fs", time.Since(start).Seconds()), actor, fmt.Sprintf(format, args...))
	}
	path := filepath.Join(dir, "fenced.db")
	drv, err := sqlite.Open(path)
	if err != nil {
		return false, err
	}
	s, err := fenced.New(ctx, drv, nil)
	if err != nil {
		_ = drv.Close()
		return false, err
	}
	defer s.Close()
	if err := s.Provision(ctx, demoResource); err != nil {
		return false, err
	}
	url := "sqlite:" + path
	extra := t.args
	if fence {
		extra = append(extra, "--fence")
	}

	// 1. A acquires (and fences), then builds until "go".
	wa, err := startWorker(ctx, exe, url, "A", demoTTLA, payloadA, false, true, extra...)
	if err != nil {
		return false, err
	}
	defer wa.cleanup()
	ev, err := wa.expect("acquired")
	if err != nil {
		return false, err
	}
	tokA := ev.Token
	say("A", "acquired token %s; starts a long build", tokA)
	if fence {
		if _, err := wa.expect("fenced"); err != nil {
			return false, err
		}
		say("A", "%s", t.fenced(tokA))
	}
	if err := stopProcess(wa.cmd.Process); err != nil {
		return false, fmt.Errorf("suspend worker A: %w", err)
	}
	say("demo", "SIGSTOP A (pid %d): a pause longer than its lease", wa.cmd.Process.Pid)
	if _, err := waitExpired(ctx, s, ev.Generation); err != nil {
		return false, err
	}
	say("demo", "the lease store says A's lease expired")

	// 2. B acquires (and fences) and builds; it has written nothing yet.
	wb, err := startWorker(ctx, exe, url, "B", demoTTLB, payloadB, false, true, extra...)
	if err != nil {
		return false, err
	}
	defer wb.cleanup()
	ev, err = wb.expect("acquired")
	if err != nil {
		return false, err
	}
	tokB := ev.Token
	say("B", "acquired token %s; starts building (it has written nothing yet)", tokB)
	if fence {
		if _, err := wb.expect("fenced"); err != nil {
			return false, err
		}
		say("B", "%s", t.fenced(tokB))
	} else {
		say("B", "%s", t.unfenced(tokB))
	}

	// 3. A resumes and sends its report with its old token.
	if err := contProcess(wa.cmd.Process); err != nil {
		return false, fmt.Errorf("resume worker A: %w", err)
	}
	say("demo", "SIGCONT A; its build finishes and it sends %q with token %s", payloadA, tokA)
	if err := wa.send("go"); err != nil {
		return false, err
	}
	ev, err = wa.expect("written", "refused")
	if err != nil {
		return false, err
	}
	accepted := ev.Event == "written"
	if accepted {
		say("A", "%s", t.accepted)
	} else {
		say("A", t.refused, ev.Reason)
	}
	code := wa.wait()
	say("A", "exited with code %d", code)
	body, tok := t.read(ctx)
	if body == "" {
		say("demo", "%s now see no report", t.readers)
	} else {
		say("demo", "%s now see %q written with token %s, while B owns the resource", t.readers, body, tok)
	}

	// 4. B finishes.
	if err := wb.send("go"); err != nil {
		return false, err
	}
	if _, err := wb.expect("written"); err != nil {
		return false, err
	}
	say("B", "wrote %q with token %s %s", payloadB, tokB, t.wrote)
	if code := wb.wait(); code != ExitOK {
		return false, fmt.Errorf("worker B exited with code %d: %s", code, wb.stderrText())
	}
	return accepted, nil
}

// demoServiceWrite is a demo worker's write to the participating service, after its build:
// PUT /report with the lease's Fencing-Token. A 409 is reported and returned as a refusal.
func (a *app) demoServiceWrite(ctx context.Context, service string, lease *fenced.Lease, payload []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, service+"/report", bytes.NewReader(payload))
	if err != nil {
		return err
	}
	c := &http.Client{Transport: &destination.Transport{Holder: lease}, Timeout: demoStep}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("write to the service: %w", err)
	}
	defer resp.Body.Close()
	var p gate.Problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	switch resp.StatusCode {
	case http.StatusNoContent:
		return a.print(workerEvent{Event: "written", Generation: lease.Generation(), Token: lease.Token().String()})
	case http.StatusConflict:
		reason := fmt.Sprintf("token %s is older than the service's mark %s", lease.Token(), p.Current)
		_ = a.print(workerEvent{Event: "refused", Generation: lease.Generation(), Reason: reason})
		return &destination.StaleError{Resource: lease.Resource(), Token: lease.Token()}
	}
	return fmt.Errorf("write to the service: %s: %s", resp.Status, p.Detail)
}

// demoDestinationFlag adds --destination and --azure to the demo command.
func demoDestinationFlag(cmd *cobra.Command, dest, azure *string) {
	cmd.Flags().StringVar(dest, "destination", "row", `where the paused worker's write goes: "row" (fenced's own publication), "gate" (a participating service) or "azure" (an Azure blob)`)
	cmd.Flags().StringVar(azure, "azure", "", "the Azure Blob endpoint of --destination azure (default $FENCED_AZURE, else Azurite's "+azuriteURL+")")
}

// demoServiceWorker acquires, fences the service if asked, waits for "go" (its build) and
// writes its payload to the service, reporting each step as a JSON line. Like the publishing
// worker, it does not consult its trust window: the service's check is the fence.
func (a *app) demoServiceWorker(cmd *cobra.Command, service string, ttl time.Duration, payload []byte, fence, wait bool) error {
	return a.demoDestinationWorker(cmd, ttl, &destination.Remote{URL: service + "/fence"}, fence, wait,
		func(ctx context.Context, lease *fenced.Lease) error {
			return a.demoServiceWrite(ctx, service, lease, payload)
		})
}

// demoDestinationWorker is a demo worker that writes to a destination: it acquires, fences
// dest if asked, waits for "go" (its build) and calls write, reporting each step as a JSON line.
func (a *app) demoDestinationWorker(cmd *cobra.Command, ttl time.Duration, dest fenced.Fencer, fence, wait bool,
	write func(context.Context, *fenced.Lease) error) error {
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
		Token: lease.Token().String(), LeaseUntil: timeJSON(lease.LeaseUntil())}); err != nil {
		return err
	}
	if fence {
		if err := lease.Fence(ctx, dest); err != nil {
			return err
		}
		if err := a.print(workerEvent{Event: "fenced", Generation: lease.Generation()}); err != nil {
			return err
		}
	}
	if wait {
		line, err := bufio.NewReader(a.stdin).ReadString('\n')
		if strings.TrimSpace(line) != "go" {
			return fmt.Errorf("worker: expected \"go\" on standard input: %v", err)
		}
	}
	return write(ctx, lease)
}
