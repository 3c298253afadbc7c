// Package cli implements the fenced command: one cobra command per protocol operation, each
// writing to the writers Main was given, so that the commands can be run and tested as a real
// process. Exit codes are listed in exit.go and in every command's help.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fenced-dev/fenced"
)

// Main runs the fenced command line with args (without the program name) and returns the
// process's exit code. Errors are printed to stderr as one sentence prefixed "fenced: ".
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.root()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	if !a.ran {
		// cobra rejected the command line (unknown command or flag, bad or missing argument)
		// before any command ran.
		hint := `; see "fenced help"`
		if cmd != nil && cmd != root {
			hint = fmt.Sprintf("; see %q", cmd.CommandPath()+" --help")
		}
		err = &usageError{msg: err.Error() + hint}
	}
	fmt.Fprintln(stderr, a.redact(sentence(err)))
	return exitCode(err)
}

// app holds what every command shares. One app serves one Main call.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	db             string        // --db
	strict         bool          // --strict-durability
	allowNonDur    bool          // --allow-nondurable
	maxTTL         time.Duration // --max-ttl
	ran            bool          // the command line was accepted and a command started
	op             string        // what the user asked for, e.g. show "r": opening errors name it
}

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "fenced",
		Short: "Leases with fencing tokens: only the current owner's write is accepted",
		Long: `fenced keeps, per resource, a lease (owner, expiry, generation) beside a published
result. Acquiring a lease increments the generation; with the recovery epoch it makes the
fencing token, printed as EPOCH.GENERATION. A publication, renewal or release carries the
owner and the token (--owner O --token E.G) and the database accepts it only if that lease
is still the current, unexpired one. Expiry is judged by the database's clock.

Start with "fenced demo" to see a paused worker's stale write refused.

` + dbHelp + `
The schema is created on first use; "fenced migrate" does it explicitly.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.PersistentFlags().StringVar(&a.db, "db", "", dbHelp)
	root.PersistentFlags().BoolVar(&a.allowNonDur, "allow-nondurable", false,
		"run on a database configured so that a crash can lose acknowledged generations (fsync off, Redis without appendfsync always, ...), which is refused without it; a warning names the settings once")
	root.PersistentFlags().BoolVar(&a.strict, "strict-durability", false,
		"also refuse to start when the database's durability settings cannot be read; without it, a warning")
	root.PersistentFlags().DurationVar(&a.maxTTL, "max-ttl", fenced.MaxTTL,
		"the longest ttl to acquire or renew for; prune keeps records for at least this plus "+fenced.PruneMargin.String()+" (use one value for everything that shares the database)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		// A bad duration reads as --ttl's does, not as time.ParseDuration's message behind pflag's.
		var bad *pflag.InvalidValueError
		if errors.As(err, &bad) && bad.GetFlag().Value.Type() == "duration" {
			return fmt.Errorf("invalid --%s %q: use a duration such as 30s, 5m or 1h", bad.GetFlag().Name, bad.GetValue())
		}
		return err
	})
	root.AddCommand(a.migrateCmd(), a.provisionCmd(), a.acquireCmd(), a.renewCmd(),
		a.publishCmd(), a.releaseCmd(), a.showCmd(), a.getCmd(), a.runCmd(), a.demoCmd(), a.demoWorkerCmd(),
		a.tortureCmd(), a.tortureWorkerCmd(), a.resolveCmd(), a.epochCmd(), a.grantCmd(), a.pruneCmd(), a.gcCmd(),
		a.serveCmd(), a.serveTokenCmd())
	for _, c := range append(root.Commands(), root) {
		if !c.Hidden {
			if c.Long == "" { // cobra shows Long instead of Short
				c.Long = c.Short + "."
			}
			c.Long += "\n\n" + exitCodesHelp
		}
	}
	return root
}

// run wraps a command's body: once it starts, cobra has accepted the command line (flags,
// arguments and required flags are validated before RunE), so its errors are classified by
// exitCode rather than reported as usage errors.
func (a *app) run(body func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.ran = true
		a.op = strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
		if len(args) == 1 || len(args) > 0 && cmd.Name() == "run" {
			a.op += fmt.Sprintf(" %q", args[0])
		}
		return body(cmd, args)
	}
}

// dbURL is --db, else $FENCED_DB, else the file fenced.db in the current directory.
func (a *app) dbURL(cmd *cobra.Command) string {
	if cmd.Flags().Changed("db") {
		return a.db
	}
	if env := os.Getenv("FENCED_DB"); env != "" {
		return env
	}
	return defaultDB
}

// open returns a store over the selected database, creating the schema if needed. Its errors
// name the operation the user asked for, not the migration every command starts with.
func (a *app) open(cmd *cobra.Command) (*fenced.Store, error) {
	drv, err := openDriver(cmd.Context(), a.dbURL(cmd))
	if err != nil {
		return nil, err
	}
	if err := drv.Migrate(cmd.Context()); err != nil {
		_ = drv.Close()
		return nil, fmt.Errorf("%s: %w", a.op, err)
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := fenced.New(cmd.Context(), drv, &fenced.Config{Logger: logger, StrictDurability: a.strict,
		AllowNonDurable: a.allowNonDur, MaxTTL: a.maxTTL, SkipMigrate: true})
	if err != nil {
		_ = drv.Close()
		return nil, fmt.Errorf("%s: %w", a.op, err)
	}
	return s, nil
}

func (a *app) print(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// oneResource accepts exactly one RESOURCE argument.
var oneResource = oneArg("RESOURCE")

// oneArg accepts exactly one argument, named in the error as name.
func oneArg(name string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%s takes exactly one %s argument, got %d", cmd.Name(), name, len(args))
		}
		return nil
	}
}

func parseTTL(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, usagef("invalid --ttl %q: use a duration such as 30s, 5m or 1h", s)
	}
	if d <= 0 {
		return 0, usagef("invalid --ttl %q: it must be positive", s)
	}
	return d, nil
}

func parseGeneration(s string) (int64, error) { return parsePositive("--generation", s) }

func parsePositive(flag, s string) (int64, error) {
	g, err := strconv.ParseInt(s, 10, 64)
	if err != nil || g < 1 {
		return 0, usagef("invalid %s %q: it must be a positive integer", flag, s)
	}
	return g, nil
}

// leaseFlags are the flags of the commands that present a lease: --owner, and the token either
// as one value (--token E.G) or as --generation with an optional --epoch.
type leaseFlags struct{ owner, generation, epoch, token string }

// leaseFlagsUsage is the part of Use that names the lease flags.
const leaseFlagsUsage = "--owner O (--token E.G | --generation G [--epoch E])"

func (f *leaseFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.owner, "owner", "", "owner printed by acquire (required)")
	cmd.Flags().StringVar(&f.token, "token", "", `token printed by acquire, EPOCH.GENERATION (e.g. "2.1"); or give --generation`)
	cmd.Flags().StringVar(&f.generation, "generation", "", "generation printed by acquire; or give --token")
	cmd.Flags().StringVar(&f.epoch, "epoch", "", "epoch printed by acquire, with --generation (default: the epoch of the resource's latest acquisition, read from the database)")
	_ = cmd.MarkFlagRequired("owner")
}

// leaseFlagsHelp is appended to the help of the commands that present a lease.
const leaseFlagsHelp = `

The lease is the owner and token printed by acquire: --owner O --token E.G, or --owner O
--generation G. Without --epoch (and without --token), the epoch is that of the resource's
latest acquisition as the database reports it just before the command: the owner is a fresh
random identity of one acquisition, so owner and generation name exactly one lease, and the
database still checks owner, epoch and generation together. An operation whose lease was
acquired before "fenced epoch bump" is refused either way.`

// parsedLease is a lease as given on the command line; epoch is 0 when it was not given.
type parsedLease struct {
	owner             string
	epoch, generation int64
}

// parse checks the lease flags before anything is sent to the database.
func (f *leaseFlags) parse(cmd *cobra.Command) (parsedLease, error) {
	p := parsedLease{owner: f.owner}
	if err := fenced.ValidateOwner(f.owner); err != nil {
		return p, err
	}
	switch hasToken, hasGen, hasEpoch := cmd.Flags().Changed("token"), cmd.Flags().Changed("generation"), cmd.Flags().Changed("epoch"); {
	case hasToken && (hasGen || hasEpoch):
		return p, usagef("give the lease's token either as --token or as --generation and --epoch, not both")
	case hasToken:
		t, err := fenced.ParseToken(f.token)
		if err != nil {
			var inv *fenced.InvalidError
			if errors.As(err, &inv) {
				return p, usagef("invalid --token: %s", inv.Reason)
			}
			return p, err
		}
		p.epoch, p.generation = t.Epoch, t.Generation
	case !hasGen:
		return p, usagef("missing --token or --generation: give the token printed by acquire")
	default:
		var err error
		if p.generation, err = parseGeneration(f.generation); err != nil {
			return p, err
		}
		if hasEpoch {
			if p.epoch, err = parsePositive("--epoch", f.epoch); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

// lease opens the store and returns a handle on the presented lease, and whether its epoch is
// known. The caller closes the store.
func (a *app) lease(cmd *cobra.Command, resource string, p parsedLease) (*fenced.Store, *fenced.Lease, bool, error) {
	s, err := a.open(cmd)
	if err != nil {
		return nil, nil, false, err
	}
	known := true
	if p.epoch == 0 {
		if p.epoch, known, err = resolveEpoch(cmd.Context(), s, resource, p.owner, p.generation); err != nil {
			_ = s.Close()
			return nil, nil, false, err
		}
	}
	l, err := s.LeaseFor(resource, p.owner, fenced.Token{Epoch: p.epoch, Generation: p.generation})
	if err != nil {
		_ = s.Close()
		return nil, nil, false, err
	}
	return s, l, known, nil
}

// resolveEpoch returns the epoch to present with owner and generation when none was given: the
// epoch of the resource's latest acquisition. known is false when the row does not show this
// generation under this owner (or under no owner, after a release or a bump), so that the
// epoch is only a guess and a refusal must not name it.
//
// The read is advisory; it decides nothing. The conditional statement that follows still
// matches owner AND epoch AND generation (and expiry) on the row, so the resolved epoch gives
// no more than typing --epoch after "fenced show", and the epoch is no secret: the owner is.
// Every acquisition installs a fresh 128-bit random owner, and a bump or release clears it, so
// a stale holder's owner is no longer on the row and its statement is refused whatever epoch
// it presents. If the row changes between this read and the statement (a new acquisition, a
// bump), the statement sees the change and refuses. What the read buys is that the current
// holder is never refused for not knowing the epoch after a bump.
func resolveEpoch(ctx context.Context, s *fenced.Store, resource, owner string, gen int64) (epoch int64, known bool, err error) {
	st, err := s.Show(ctx, resource)
	switch {
	case errors.Is(err, fenced.ErrNotProvisioned):
		return 1, false, nil // the statement reports the missing resource
	case err != nil:
		return 0, false, fmt.Errorf("read the epoch of the lease: %w", err)
	}
	epoch = st.Epoch
	if epoch < 1 { // never acquired: no generation to match, any epoch is refused
		epoch = max(st.CurrentEpoch, 1)
	}
	return epoch, st.Generation == gen && (st.Owner == owner || st.Owner == ""), nil
}

// withoutGuessedEpoch drops the epoch from a refusal when it was only guessed, so that the
// message names the generation the user gave rather than a token they never held.
func withoutGuessedEpoch(err error, known bool) error {
	re, ok := err.(*fenced.RefusedError)
	if known || !ok {
		return err
	}
	c := *re
	c.Epoch = 0
	return &c
}

// timeJSON formats a database time for output, RFC 3339 in UTC; the zero time is null.
func timeJSON(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}
