package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination/artifact"
)

func (a *app) migrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the schema (every command also does this on first use)",
		Long:  "Create or upgrade the schema. It is idempotent and safe to run concurrently.",
		Args:  cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			s, err := a.open(cmd) // opening migrates
			if err != nil {
				return err
			}
			defer s.Close()
			return a.print(map[string]any{"migrated": true})
		}),
	}
}

func (a *app) provisionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "provision RESOURCE...",
		Short: "Create resources at generation 0 (existing ones are left unchanged)",
		Long: `Create each resource's row at generation 0 if it does not exist. An existing resource is
left as it is, so its generation is never reset: provisioning at every start is safe.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("provision takes at least one RESOURCE argument")
			}
			return nil
		},
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.Provision(cmd.Context(), args...); err != nil {
				return err
			}
			return a.print(map[string]any{"provisioned": args})
		}),
	}
}

// leaseJSON is what acquire and renew print. Token is the epoch and generation as one value,
// the form --token accepts.
type leaseJSON struct {
	Resource   string  `json:"resource"`
	Owner      string  `json:"owner"`
	Token      string  `json:"token"`
	Epoch      int64   `json:"epoch"`
	Generation int64   `json:"generation"`
	LeaseUntil *string `json:"lease_until"`
}

func newLeaseJSON(l *fenced.Lease) leaseJSON {
	return leaseJSON{Resource: l.Resource(), Owner: l.Owner(), Token: l.Token().String(), Epoch: l.Epoch(),
		Generation: l.Generation(), LeaseUntil: timeJSON(l.LeaseUntil())}
}

func (a *app) acquireCmd() *cobra.Command {
	var (
		ttl  string
		wait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "acquire RESOURCE --ttl DURATION [--wait DURATION]",
		Short: "Take the resource's lease if it is free or expired",
		Long: `Take the resource's lease for DURATION if it is free or its holder's lease has expired on
the database's clock. The generation is incremented in the same statement. Prints the
owner and the token (as "token":"EPOCH.GENERATION", and as epoch and generation) to pass to
renew, publish and release: --owner O --token E.G.

With --wait, a busy resource is retried until it is granted or the wait ends: with a capped
back-off, and when the holder's lease runs out on the database's clock.`,
		Args: oneResource,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			d, err := parseTTL(ttl)
			if err != nil {
				return err
			}
			if wait < 0 {
				return usagef("invalid --wait %s: it must not be negative", wait)
			}
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			var l *fenced.Lease
			if wait > 0 {
				ctx, cancel := context.WithTimeout(cmd.Context(), wait)
				l, err = s.AcquireWait(ctx, args[0], d)
				cancel()
			} else {
				l, err = s.Acquire(cmd.Context(), args[0], d)
			}
			var unknown *fenced.OutcomeUnknownError
			if errors.As(err, &unknown) && unknown.Owner != "" {
				return fmt.Errorf(`%w; "fenced show %s" tells whether owner %s holds it, and if so "fenced release %[2]s --owner %[3]s --generation G", with the generation shown, frees it (else it expires after its TTL)`,
					err, shellQuote(args[0]), unknown.Owner)
			}
			if err != nil {
				return err
			}
			return a.print(newLeaseJSON(l))
		}),
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "how long to wait while the resource is busy, e.g. 1m (default: do not wait); then exit 3")
	cmd.Flags().StringVar(&ttl, "ttl", "", "how long the lease lasts, e.g. 30s (required)")
	_ = cmd.MarkFlagRequired("ttl")
	return cmd
}

func (a *app) renewCmd() *cobra.Command {
	var (
		lf  leaseFlags
		ttl string
	)
	cmd := &cobra.Command{
		Use:   "renew RESOURCE " + leaseFlagsUsage + " --ttl DURATION",
		Short: "Extend a current lease to database-now + DURATION",
		Long: `Extend the lease to the database's now + DURATION, only if it is still the current,
unexpired lease: a late renewal never revives an expired or superseded lease.` + leaseFlagsHelp,
		Args: oneResource,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			d, err := parseTTL(ttl)
			if err != nil {
				return err
			}
			p, err := lf.parse(cmd)
			if err != nil {
				return err
			}
			s, l, known, err := a.lease(cmd, args[0], p)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := l.Renew(cmd.Context(), d); err != nil {
				return withoutGuessedEpoch(err, known)
			}
			return a.print(newLeaseJSON(l))
		}),
	}
	lf.add(cmd)
	cmd.Flags().StringVar(&ttl, "ttl", "", "new time to live from the database's now, e.g. 30s (required)")
	_ = cmd.MarkFlagRequired("ttl")
	return cmd
}

func (a *app) publishCmd() *cobra.Command {
	var (
		lf            leaseFlags
		af            artifactFlags
		file          string
		release       bool
		opID          string
		sourceVersion int64
	)
	cmd := &cobra.Command{
		Use:   "publish RESOURCE " + leaseFlagsUsage + " [--file PATH | --artifact PATH [--store URL]]",
		Short: "Store a payload as the resource's result, if the lease is still current",
		Long: fmt.Sprintf(`Store the payload (the file named by --file, else standard input) as the resource's
published result, only if the lease presented is still the current, unexpired one, its
generation has not published yet, its --source-version (if any) is not older than the
published one, and its --op-id has not been accepted or resolved before. If the reply is
lost the exit code is 6 and the error names the operation id: "fenced resolve ID" then says
for certain whether it was accepted. The whole payload, at most %d bytes, is read before
the database is touched; a larger one is rejected and nothing is written.

With --artifact, the file is streamed, whatever its size, into a new object of the artifact
store under a key unique to this lease, and the payload published is a pointer to it (key,
SHA-256, size, content type). A refused pointer leaves the object unreferenced, for gc.`, fenced.DefaultMaxPayloadBytes) + leaseFlagsHelp,
		Args: oneResource,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			p, err := lf.parse(cmd)
			if err != nil {
				return err
			}
			if af.file != "" && file != "" {
				return usagef("give --file or --artifact, not both")
			}
			if opID == "" {
				opID = rand.Text() // printed either way, so that an unknown outcome can be resolved
			}
			opts := []fenced.PublishOption{fenced.WithOpID(opID), fenced.WithSourceVersion(sourceVersion)}
			if af.file != "" {
				return a.publishArtifact(cmd, args[0], p, &af, opts, opID, release)
			}
			payload, err := a.readPayload(file, fenced.DefaultMaxPayloadBytes)
			if err != nil {
				return err
			}
			s, l, known, err := a.lease(cmd, args[0], p)
			if err != nil {
				return err
			}
			defer s.Close()
			if release {
				err = l.PublishAndRelease(cmd.Context(), payload, opts...)
			} else {
				err = l.Publish(cmd.Context(), payload, opts...)
			}
			if err != nil {
				return withoutGuessedEpoch(err, known)
			}
			return a.print(map[string]any{"resource": l.Resource(), "token": l.Token().String(),
				"published_generation": l.Generation(), "published_epoch": l.Epoch(), "op_id": opID,
				"payload_bytes": len(payload), "released": release})
		}),
	}
	lf.add(cmd)
	af.add(cmd)
	cmd.Flags().StringVar(&file, "file", "", "read the payload from this file instead of standard input")
	cmd.Flags().BoolVar(&release, "release", false, "also release the lease, in the same statement")
	cmd.Flags().StringVar(&opID, "op-id", "", "operation id, to resolve the outcome later if the reply is lost (default: a fresh one, named in the error)")
	cmd.Flags().Int64Var(&sourceVersion, "source-version", 0, "version of the source data; refused if older than the published one (0: not checked)")
	return cmd
}

// readPayload reads the whole payload, refusing one larger than limit before anything is sent.
func (a *app) readPayload(file string, limit int) ([]byte, error) {
	r, name := a.stdin, "standard input"
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("read payload: %w", err)
		}
		defer f.Close()
		r, name = f, file
	}
	payload, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("read payload from %s: %w", name, err)
	}
	if len(payload) > limit {
		return nil, usagef("the payload from %s is larger than the limit of %d bytes; nothing was written", name, limit)
	}
	return payload, nil
}

func (a *app) releaseCmd() *cobra.Command {
	var lf leaseFlags
	cmd := &cobra.Command{
		Use:   "release RESOURCE " + leaseFlagsUsage,
		Short: "Free a lease, if owner and token still match",
		Long: `Free the lease so that another owner can acquire it at once, only if the owner and
token presented still hold it. It never resets the generation.` + leaseFlagsHelp,
		Args: oneResource,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			p, err := lf.parse(cmd)
			if err != nil {
				return err
			}
			s, l, known, err := a.lease(cmd, args[0], p)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := l.Release(cmd.Context()); err != nil {
				return withoutGuessedEpoch(err, known)
			}
			return a.print(map[string]any{"resource": l.Resource(), "token": l.Token().String(), "epoch": l.Epoch(),
				"generation": l.Generation(), "released": true})
		}),
	}
	lf.add(cmd)
	return cmd
}

// stateJSON is what show prints. Owner and lease_until are the row's as stored (null when the
// lease is free); held says whether that lease was unexpired at database_now.
type stateJSON struct {
	Resource            string  `json:"resource"`
	Epoch               int64   `json:"epoch"`
	Generation          int64   `json:"generation"`
	Owner               *string `json:"owner"`
	LeaseUntil          *string `json:"lease_until"`
	Held                bool    `json:"held"`
	PublishedEpoch      int64   `json:"published_epoch"`
	PublishedGeneration int64   `json:"published_generation"`
	PublishedAt         *string `json:"published_at"`
	SourceVersion       int64   `json:"source_version"`
	PayloadBytes        int64   `json:"payload_bytes"`
	CurrentEpoch        int64   `json:"current_epoch"`
	DatabaseNow         *string `json:"database_now"`
	// Artifact is the published pointer when the payload is one.
	Artifact *pointerJSON `json:"artifact,omitempty"`
}

func newStateJSON(st fenced.State) stateJSON {
	out := stateJSON{
		Resource:            st.Resource,
		Epoch:               st.Epoch,
		Generation:          st.Generation,
		LeaseUntil:          timeJSON(st.LeaseUntil),
		Held:                st.Held(),
		PublishedEpoch:      st.PublishedEpoch,
		PublishedGeneration: st.PublishedGeneration,
		PublishedAt:         timeJSON(st.PublishedAt),
		SourceVersion:       st.SourceVersion,
		PayloadBytes:        st.PayloadSize,
		CurrentEpoch:        st.CurrentEpoch,
		DatabaseNow:         timeJSON(st.Now),
	}
	if st.Owner != "" {
		out.Owner = &st.Owner
	}
	return out
}

func (a *app) showCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show RESOURCE",
		Short: "Print the resource's lease and publication state and the database's clock",
		Long: `Print the resource's state as one JSON object: generation, owner and lease_until (null
when the lease is free; an expired holder stays until someone acquires or releases), held
(whether that lease is unexpired at database_now), published_generation, published_at
(null if nothing was published), payload_bytes and database_now. The token of the current
generation is (epoch, generation); current_epoch is the store's epoch, which every new
acquisition gets; published_epoch and source_version belong to the published payload.
When the payload is an artifact pointer, "artifact" holds it.`,
		Args: oneResource,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			st, err := s.Show(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := newStateJSON(st)
			if out.Artifact, err = publishedPointer(cmd.Context(), s, st); err != nil {
				return err
			}
			return a.print(out)
		}),
	}
}

func (a *app) getCmd() *cobra.Command {
	var (
		store, output string
		asPointer     bool
	)
	cmd := &cobra.Command{
		Use:   "get RESOURCE [--pointer] [--output FILE] [--store URL]",
		Short: "Write the published payload, or the artifact it points to, byte for byte",
		Long: `Write the resource's published payload to standard output, byte for byte, and nothing else.
When the payload is an artifact pointer, the artifact is streamed from the store instead and
checked against the pointer's size and SHA-256 while it streams; a mismatch or a missing
object is an error (exit 1), and with --output the file is only created once every byte was
verified. --pointer prints the pointer as JSON instead.`,
		Args: oneResource,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			payload, gen, err := s.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asPointer {
				p, err := artifact.DecodePointer(args[0], payload)
				if err != nil {
					return err
				}
				return a.print(pointerJSON{p, gen})
			}
			if artifact.IsPointer(payload) {
				return a.getArtifact(cmd, s, args[0], payload, store, output)
			}
			if output != "" {
				return writeFileAtomic(output, payload)
			}
			if _, err := a.stdout.Write(payload); err != nil {
				return fmt.Errorf("write payload: %w", err)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asPointer, "pointer", false, "print the published artifact pointer as JSON instead of following it")
	cmd.Flags().StringVar(&output, "output", "", "write to this file (created only when complete and verified) instead of standard output")
	addStoreFlag(cmd, &store)
	return cmd
}

// shellQuote quotes s for a POSIX shell when it holds anything but letters, digits and ._/-,
// so that a command suggested in a message can be pasted as it is.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
