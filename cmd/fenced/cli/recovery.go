package cli

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
)

func (a *app) resolveCmd() *cobra.Command {
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "resolve OP_ID",
		Short: "Say for certain whether a publication was accepted, by its operation id",
		Long: `Print the final outcome of the publication with operation id OP_ID: "accepted" (with the
resource, epoch and generation that published it) or "not_accepted". The answer is final:
an id with no recorded outcome is recorded as aborted in the same step, so a late delivery of
that publication is refused. Use it after publish exited 6 (outcome unknown).

--read-only records nothing: it prints the recorded outcome, or "unknown" when none is
recorded yet (the publication may still arrive). A role granted --as reader may run it.`,
		Args: oneArg("OP_ID"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			var r fenced.Resolution
			if readOnly {
				var found bool
				if r, found, err = s.LookupOperation(cmd.Context(), args[0]); err != nil {
					return err
				}
				if !found {
					return a.print(map[string]any{"op_id": r.OpID, "outcome": "unknown"})
				}
			} else if r, err = s.Resolve(cmd.Context(), args[0]); err != nil {
				return err
			}
			out := map[string]any{"op_id": r.OpID, "outcome": "not_accepted", "recorded_at": timeJSON(r.RecordedAt)}
			if r.Accepted {
				out["outcome"] = "accepted"
				out["resource"], out["epoch"], out["generation"] = r.Resource, r.Token.Epoch, r.Token.Generation
			}
			return a.print(out)
		}),
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "record nothing; print the recorded outcome or \"unknown\"")
	return cmd
}

func (a *app) epochCmd() *cobra.Command {
	epoch := &cobra.Command{
		Use:   "epoch",
		Short: "Recovery epochs: run \"fenced epoch bump\" after a restore or a failover",
		// Runnable, so that cobra checks its arguments: a command with only subcommands prints
		// its help and exits 0 for a mistyped one, and "fenced epoch bumb" after a restore
		// would look like a bump that succeeded.
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New(`epoch needs a subcommand: "fenced epoch bump"`)
		},
	}
	epoch.AddCommand(&cobra.Command{
		Use:   "bump",
		Short: "Advance the recovery epoch: every lease issued before is refused",
		Long: `Durably advance the store's recovery epoch and free every lease. Run it after restoring
the database from a copy, or after a failover that may have lost acknowledged commits, before
any worker continues: every lease issued before it is refused, and every token issued after it
compares greater than every earlier one (tokens are epoch, then generation). Stop the old
workers first where you can; the bump makes their writes fail either way.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			e, err := s.BumpEpoch(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(map[string]any{"epoch": e})
		}),
	})
	return epoch
}

func (a *app) grantCmd() *cobra.Command {
	var (
		role, as string
		prefixes []string
	)
	cmd := &cobra.Command{
		Use:   "grant --role NAME [--as worker|reader|admin] [--prefix P]...",
		Short: "Let a database role use the protocol, at a level, and nothing else on fenced's tables",
		Long: `Install the protocol as database routines and grant the existing role NAME the right to
execute those its level includes, and nothing else on fenced's tables (PostgreSQL: SECURITY
DEFINER functions; MariaDB/MySQL: SQL SECURITY DEFINER procedures; SQL Server: procedures).
Code connected as that role can then only write through the fence; a store connected as it
works unchanged. Run it connected as the tables' owner (on MariaDB, with SELECT on the mysql
database, to read the role's privileges). Not available for SQLite, etcd or Redis (exit 2).

It refuses (exit 1, nothing changed) a role that could get around the routines: one that may
still write fenced's tables or execute a routine its level excludes through a right it holds
another way (a group role, pg_write_all_data, a grant on the database, a role's or PUBLIC's),
a PostgreSQL superuser or CREATEROLE role, a MariaDB account with SUPER or SET USER or one
that may create temporary tables; the message names the right and where it comes from.

Levels (--as, default worker):
  reader  show, get; nothing that writes
  worker  acquire, renew, publish, release, resolve, and what a reader may
  admin   provision, epoch bump, prune, and what a worker may
Provision is an admin's: it decides which resources exist. Granting a role again with
another level revokes what the new level does not include.

--prefix (repeatable) limits the role to resources whose names start with one of the
prefixes, checked by the database inside the routines (PostgreSQL, MariaDB/MySQL); without
it, every resource. Granting again replaces the prefixes.

An operation the role was not granted is refused by the database with one sentence naming
the operation and the role, and exit code 8; nothing changes.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			level, err := fenced.ParseAccess(as)
			if err != nil {
				return usagef("--as %q is not a level; use worker, reader or admin", as)
			}
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.Grant(cmd.Context(), role, &fenced.GrantOptions{Access: level, Prefixes: prefixes}); err != nil {
				return err
			}
			out := map[string]any{"granted": role, "as": level.String()}
			if len(prefixes) > 0 {
				out["prefixes"] = prefixes
			}
			return a.print(out)
		}),
	}
	cmd.Flags().StringVar(&role, "role", "", "the database role to grant (required)")
	cmd.Flags().StringVar(&as, "as", "worker", "the level: worker, reader or admin")
	cmd.Flags().StringArrayVar(&prefixes, "prefix", nil, "limit the role to resources starting with this prefix (repeatable)")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

func (a *app) pruneCmd() *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION",
		Short: "Delete operation records older than DURATION",
		Long: `Delete the recorded outcomes of publications older than DURATION on the database's clock.
DURATION must be at least --max-ttl plus ` + fenced.PruneMargin.String() + `: once an aborted id is pruned, a late
delivery of its publication would be accepted while its lease lasts, and resolve's answer
would have been wrong. With the default --max-ttl (366 days), records are kept for 367 days;
give every command and program that uses the database a smaller --max-ttl (Config.MaxTTL) to
prune sooner.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			if olderThan <= 0 {
				return usagef("invalid --older-than %s: it must be positive", olderThan)
			}
			if min := a.maxTTL + fenced.PruneMargin; olderThan < min {
				return usagef("invalid --older-than %s: it must be at least --max-ttl (%s) plus %s, or an aborted publication could still arrive and be accepted", olderThan, a.maxTTL, fenced.PruneMargin)
			}
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.PruneOperations(cmd.Context(), olderThan)
			if err != nil {
				return err
			}
			return a.print(map[string]any{"pruned": n})
		}),
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "age of the records to delete, e.g. 168h (required)")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}
