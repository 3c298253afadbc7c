// Package cli implements the fenced command: one cobra command per protocol operation, each
// writing to the writers Main was given, so that the commands can be run and tested as a real
// process. Exit codes are listed in exit.go and in every command's help.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

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
	fmt.Fprintln(stderr, sentence(err))
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
}

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "fenced",
		Short: "Leases with fencing tokens: only the current owner's write is accepted",
		Long: `fenced keeps, per resource, a lease (owner, expiry, generation) beside a published
result. Acquiring a lease increments the generation, the fencing token; a publication,
renewal or release carries (owner, generation) and the database accepts it only if that
lease is still the current, unexpired one. Expiry is judged by the database's clock.

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
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	root.AddCommand(a.migrateCmd(), a.provisionCmd(), a.acquireCmd(), a.renewCmd(),
		a.publishCmd(), a.releaseCmd(), a.showCmd(), a.getCmd(), a.runCmd(), a.demoCmd(), a.demoWorkerCmd(),
		a.tortureCmd(), a.tortureWorkerCmd(), a.resolveCmd(), a.epochCmd(), a.grantCmd(), a.pruneCmd())
	for _, c := range append(root.Commands(), root) {
		if !c.Hidden {
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

// open returns a store over the selected database, creating the schema if needed.
func (a *app) open(cmd *cobra.Command) (*fenced.Store, error) {
	drv, err := openDriver(cmd.Context(), a.dbURL(cmd))
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := fenced.New(cmd.Context(), drv, &fenced.Config{Logger: logger, StrictDurability: a.strict,
		AllowNonDurable: a.allowNonDur, MaxTTL: a.maxTTL})
	if err != nil {
		_ = drv.Close()
		return nil, err
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
func oneResource(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%s takes exactly one RESOURCE argument, got %d", cmd.Name(), len(args))
	}
	return nil
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

// leaseFlags are the flags of the commands that present a lease.
type leaseFlags struct{ owner, generation, epoch string }

func (f *leaseFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.owner, "owner", "", "owner printed by acquire (required)")
	cmd.Flags().StringVar(&f.generation, "generation", "", "generation printed by acquire (required)")
	cmd.Flags().StringVar(&f.epoch, "epoch", "1", "epoch printed by acquire (needed once the epoch has been bumped)")
	_ = cmd.MarkFlagRequired("owner")
	_ = cmd.MarkFlagRequired("generation")
}

// lease opens the store and returns a handle on the presented lease. The caller closes the
// store.
func (a *app) lease(cmd *cobra.Command, resource string, f *leaseFlags) (*fenced.Store, *fenced.Lease, error) {
	gen, err := parseGeneration(f.generation)
	if err != nil {
		return nil, nil, err
	}
	epoch, err := parsePositive("--epoch", f.epoch)
	if err != nil {
		return nil, nil, err
	}
	if err := fenced.ValidateOwner(f.owner); err != nil {
		return nil, nil, err
	}
	s, err := a.open(cmd)
	if err != nil {
		return nil, nil, err
	}
	l, err := s.LeaseFor(resource, f.owner, fenced.Token{Epoch: epoch, Generation: gen})
	if err != nil {
		_ = s.Close()
		return nil, nil, err
	}
	return s, l, nil
}

// timeJSON formats a database time for output, RFC 3339 in UTC; the zero time is null.
func timeJSON(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}
