package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
)

// commandExit is a wrapped command that exited unsuccessfully: fenced run passes its code on.
type commandExit struct {
	code int
	desc string
}

func (e *commandExit) Error() string { return e.desc + "; nothing was published" }

func (a *app) runCmd() *cobra.Command {
	var (
		ttl    string
		renew  bool
		grace  time.Duration
		fences []string
		art    runArtifactFlags
		wait   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run RESOURCE --ttl DURATION [--renew] [--wait DURATION] [--fence URL]... [--artifact [--store URL]] -- COMMAND [ARGS...]",
		Short: "Run a command under the resource's lease and publish its standard output",
		Long: `Acquire the resource's lease, run COMMAND with the lease in its environment, and publish
its standard output under the lease, then release. Standard input and standard error pass
through. The environment names the lease as acquire prints it:

  FENCED_RESOURCE    the resource
  FENCED_OWNER       the owner identity of this acquisition
  FENCED_TOKEN       the token, EPOCH.GENERATION (e.g. 2.1), to hand to any destination
                     that checks it, or to "fenced renew --owner ... --token ..."
  FENCED_EPOCH       the token's epoch
  FENCED_GENERATION  the token's generation
  FENCED_TOKEN_HEADER  the value of a Fencing-Token header for a participating service:
      curl -X PUT -H "Fencing-Token: $FENCED_TOKEN_HEADER" --data-binary @out URL
  FENCED_AZURE_LEASE_ID  set only with --fence azblob:// in lease mode: the blob lease ID
                     this acquisition holds, azureblob.LeaseID(RESOURCE, FENCED_OWNER); one
                     value for every such destination, as it derives from these two alone

With --fence URL (repeatable) each destination is fenced right after acquiring and before
COMMAND starts, so that it refuses the previous holder's delayed writes:

  http(s)://HOST/PATH   a participating service: POST URL with the header (destination/gate),
                        which must confirm the fence (Fencing-Mark) within min(TTL/2, 30s)
  azblob://CONTAINER[?prefix=P]
                        the blob P+RESOURCE: the previous holder's blob lease is broken and
                        this acquisition's taken (destination/azureblob). Azure then refuses
                        every write to the blob that does not present the lease ID (header
                        x-ms-lease-id). Each write must also keep the token in the blob's
                        metadata (x-ms-meta-fencedtoken), which a later fence compares:
      az storage blob upload --container-name CONTAINER --name "P$FENCED_RESOURCE" \
        --file out --overwrite --lease-id "$FENCED_AZURE_LEASE_ID" \
        --metadata "fencedtoken=$FENCED_TOKEN"
  azblob://CONTAINER?mode=cas[&prefix=P], gs://BUCKET[?prefix=P]
                        the object P+RESOURCE: the token in its metadata, raised by a
                        conditional rewrite (destination/bucketcas). The store checks no
                        token by itself: a plain upload from the command is not fenced.
                        Each write must do what bucketcas.CAS.Write does (or call it from
                        Go): read the object's fencedtoken metadata and its ETag (GCS: its
                        generation), stop if that token is newer than FENCED_TOKEN, upload
                        with If-Match on that ETag (GCS: ifGenerationMatch) and
                        fencedtoken=FENCED_TOKEN in the metadata, and start over when the
                        condition fails.

azblob:// and gs:// take gocloud.dev's parameters and environment (AZURE_STORAGE_ACCOUNT,
AZURE_STORAGE_KEY, Google's default credentials). s3:// and any other URL are refused before
acquiring (exit 2): S3's content-hash ETags cannot fence an object. If a destination cannot be
fenced, COMMAND does not run and the exit code is 5 when it already holds a newer token, 4
when it does not know the resource, 1 when it cannot be reached.

The command is trusted only while the lease is: until acquired + TTL - safety margin on a
clock of this machine that counts a suspend (CLOCK_BOOTTIME on Linux), extended by each successful renewal with --renew. When the lease
is lost (a renewal refused, or the trust window ends) the command's process group gets
SIGTERM, then SIGKILL once --grace has passed, whether or not COMMAND itself has exited by
then; nothing is published and the exit code is 5. The grace defaults to half the safety
margin (TTL/20), at most 10s; a --grace longer than the margin (TTL/10) is refused, since a
command that ignored SIGTERM would still run after the database let another owner in. If
the lease is already lost when COMMAND would start (a slow --fence, a slow grant after
--wait), COMMAND does not start and the exit code is 5. Even a publication attempted at the
last moment is checked by the database.

When fenced itself gets SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session), the
command's process group is stopped the same way, nothing is published, the lease is
released and the exit code is 1. On Linux, a fenced killed outright (kill -9) takes
COMMAND's first process with it (SIGKILL); COMMAND's own children are not covered.

COMMAND runs in a process group of its own, so that the whole group can be stopped: if
standard input is a terminal, a COMMAND that reads it is stopped by SIGTTIN. Give it its
input through a pipe or a file (fenced run ... < input).

A command that fails publishes nothing, and its exit code is passed on (128+N when it was
killed by signal N, 127 when it could not be started).

With --artifact, the standard output is streamed, whatever its size, into a new object of the
artifact store, and the payload published is a pointer to it.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash != 1 || len(args) < 2 {
				return errors.New(`run takes one RESOURCE, then -- and the command to run`)
			}
			return nil
		},
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			d, err := parseTTL(ttl)
			if err != nil {
				return err
			}
			if wait < 0 {
				return usagef("invalid --wait %s: it must not be negative", wait)
			}
			if grace, err = runGrace(d, grace, cmd.Flags().Changed("grace")); err != nil {
				return err
			}
			var dests []fenced.Fencer
			azureLease := false
			for _, raw := range fences {
				f, leased, release, err := openFence(cmd.Context(), raw, d)
				if err != nil {
					return err
				}
				defer release()
				dests = append(dests, f)
				azureLease = azureLease || leased
			}
			if art.on {
				return a.runArtifact(cmd, args, &fenced.RunOptions{TTL: d, Renew: renew, Fence: dests, Wait: wait}, grace, azureLease, &art)
			}
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			res, err := fenced.Run(cmd.Context(), s, args[0], &fenced.RunOptions{TTL: d, Renew: renew, Fence: dests, Wait: wait},
				func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
					return a.runCommand(ctx, l, args[1:], grace, azureLease, s.MaxPayloadBytes())
				})
			if err != nil {
				return err
			}
			return a.print(map[string]any{"resource": res.Resource, "owner": res.Owner, "token": res.Token.String(),
				"epoch": res.Token.Epoch, "generation": res.Generation, "published_generation": res.Generation,
				"payload_bytes": res.Size})
		}),
	}
	cmd.Flags().StringVar(&ttl, "ttl", "", "the lease's time to live, e.g. 30s (required)")
	cmd.Flags().DurationVar(&wait, "wait", 0, "how long to wait while the resource is busy (default: do not wait); then exit 3")
	cmd.Flags().BoolVar(&renew, "renew", false, "renew the lease every TTL/3 while the command runs")
	cmd.Flags().DurationVar(&grace, "grace", 0, "how long after SIGTERM a command that lost its lease gets before SIGKILL (default: TTL/20, at most 10s; at most TTL/10)")
	cmd.Flags().StringArrayVar(&fences, "fence", nil, "fence this destination (a service's fence URL, azblob://, gs://) before the command starts; repeatable")
	art.add(cmd)
	_ = cmd.MarkFlagRequired("ttl")
	return cmd
}

// outputWait bounds the wait for the command's standard output to close once it has exited.
const outputWait = 10 * time.Second

// maxGrace is the longest default --grace.
const maxGrace = 10 * time.Second

// runGrace is the grace a stopped command gets between SIGTERM and SIGKILL. SIGTERM comes
// when the trust window ends, a safety margin before the database's expiry, so SIGKILL must
// come within that margin: the default is half of it (at most maxGrace), and an explicit
// grace longer than it is refused. The margin is the store's default, TTL/10: the CLI never
// sets Config.SafetyMargin.
func runGrace(ttl, grace time.Duration, set bool) (time.Duration, error) {
	margin := ttl / 10
	switch {
	case !set:
		return max(min(margin/2, maxGrace), time.Millisecond), nil
	case grace <= 0:
		return 0, usagef("invalid --grace %s: it must be positive", grace)
	case grace > margin:
		return 0, usagef("--grace %s is longer than the safety margin %s of --ttl %s, so a command ignoring SIGTERM would outlive the lease; give a longer --ttl (at least %s) or a shorter --grace",
			grace, margin, ttl, 10*grace)
	}
	return grace, nil
}

// runCommand runs argv with the lease in its environment and returns its standard output.
// When ctx ends (the lease is lost, or fenced is interrupted) the process group gets SIGTERM,
// then SIGKILL after grace. azureLease adds the Azure blob lease ID to the environment.
func (a *app) runCommand(ctx context.Context, l *fenced.Lease, argv []string, grace time.Duration, azureLease bool, limit int) ([]byte, error) {
	out := &limitedBuffer{limit: limit}
	if err := a.runCommandTo(ctx, l, argv, grace, azureLease, out); err != nil {
		return nil, err
	}
	if out.over {
		return nil, usagef("the output of %s is larger than the payload limit of %d bytes; nothing was published", argv[0], limit)
	}
	return out.buf, nil
}

// runCommandTo runs argv with the lease in its environment, its standard output going to out.
func (a *app) runCommandTo(ctx context.Context, l *fenced.Lease, argv []string, grace time.Duration, azureLease bool, out io.Writer) error {
	// The lease lost before the command could start: Err reads the clock itself, so a window
	// that a suspend ended shows here before ctx, which follows Done, has ended.
	if err := l.Err(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return stopCause(ctx, argv[0], "was not started")
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = commandEnv(l, azureLease)
	c.Stdin, c.Stderr = a.stdin, a.stderr
	c.Stdout = out
	c.SysProcAttr = commandProcAttr()
	// A grandchild that keeps stdout open after the command exited cannot hold us forever;
	// the grace may be a few milliseconds, too short for a command's last output.
	c.WaitDelay = max(grace, outputWait)
	// The kernel sends a parent-death signal when the thread that started the command ends,
	// not the process (go.dev/issue/27505): keep this goroutine on its thread from Start to
	// Wait, so that no other goroutine can end that thread while the command runs.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.Start(); err != nil {
		return &commandExit{code: 127, desc: fmt.Sprintf("cannot start %s: %v", argv[0], startCause(err))}
	}

	exited := make(chan struct{})
	stopped := make(chan struct{})
	go func() { // the command's lifetime is bounded by the lease's
		defer close(stopped)
		select {
		case <-exited:
			return
		case <-ctx.Done():
		}
		_ = signalGroup(c.Process, syscall.SIGTERM)
		// SIGKILL at the grace deadline even if the first process has exited: another member
		// of the group may ignore SIGTERM.
		kill := time.NewTimer(grace)
		defer kill.Stop()
		<-kill.C
		_ = signalGroup(c.Process, syscall.SIGKILL)
	}()
	// Learn that the command exited without reaping it: until Wait reaps it, its pid, which
	// is the group's id, cannot be reused, so the SIGKILL above cannot reach another group.
	var err error
	reaped := !waitExit(c.Process)
	if reaped {
		err = c.Wait()
	}
	select {
	case <-ctx.Done():
		<-stopped // reap only once the group has had its SIGKILL
	default:
	}
	close(exited)
	<-stopped
	if !reaped {
		err = c.Wait()
	}

	if ctx.Err() != nil {
		return stopCause(ctx, argv[0], "was stopped")
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &commandExit{code: 128 + int(ws.Signal()), desc: fmt.Sprintf("%s was killed by %s", argv[0], ws.Signal())}
		}
		return &commandExit{code: ee.ExitCode(), desc: fmt.Sprintf("%s exited with code %d", argv[0], ee.ExitCode())}
	case err != nil:
		return fmt.Errorf("run %s: %w", argv[0], err)
	}
	return nil
}

// azureLeaseIDVar holds the Azure blob lease ID of the acquisition, set only when an azblob://
// destination was fenced in lease mode. The ID derives from the resource and the owner alone,
// so it is one value for every such destination of the run.
const azureLeaseIDVar = "FENCED_AZURE_LEASE_ID"

// commandEnv is this process's environment with the lease's variables set, and without an
// inherited FENCED_AZURE_LEASE_ID (a fenced run inside another's command) that this run does
// not set: another acquisition's lease ID is never passed on.
func commandEnv(l *fenced.Lease, azureLease bool) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, azureLeaseIDVar+"=") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"FENCED_RESOURCE="+l.Resource(),
		"FENCED_OWNER="+l.Owner(),
		"FENCED_TOKEN="+l.Token().String(),
		"FENCED_EPOCH="+strconv.FormatInt(l.Epoch(), 10),
		"FENCED_GENERATION="+strconv.FormatInt(l.Generation(), 10),
		"FENCED_TOKEN_HEADER="+destination.FormatHeader(l.Resource(), l.Token()))
	if azureLease {
		env = append(env, azureLeaseIDVar+"="+azureblob.LeaseID(l.Resource(), l.Owner()))
	}
	return env
}

// stopCause is the error of a command that ctx stopped (or never let start): the lost lease
// as fenced.Run reports it, or the signal that interrupted fenced.
func stopCause(ctx context.Context, name, what string) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, fenced.ErrLeaseLost) {
		return cause
	}
	return fmt.Errorf("%s %s, since fenced was interrupted (%w); nothing was published", name, what, cause)
}

// limitedBuffer keeps up to limit bytes and notes whether more arrived; it keeps accepting
// writes so that the command is not killed by a broken pipe.
type limitedBuffer struct {
	buf   []byte
	limit int
	over  bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.limit - len(b.buf); n > room {
		b.over = true
		p = p[:max(room, 0)]
	}
	b.buf = append(b.buf, p...)
	return n, nil
}

// startCause is why a command could not start, without the command's name, which the message
// already gives: exec.Command and Start wrap the system's answer ("no such file or directory",
// "permission denied") in errors that repeat the path.
func startCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}
