package fenced

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/trustclock"
)

// State is one resource's row as read at one moment, including the database's clock.
type State = driver.State

// Limits on input, checked before anything is sent to the database.
const (
	MaxResourceLen = 255 // bytes
	MaxOwnerLen    = 128 // bytes
	MinTTL         = time.Millisecond
	MaxTTL         = 366 * 24 * time.Hour

	// DefaultMaxPayloadBytes is Config.MaxPayloadBytes when it is zero.
	DefaultMaxPayloadBytes = 4 << 20
	// DefaultReleaseTimeout is Config.ReleaseTimeout when it is zero.
	DefaultReleaseTimeout = 5 * time.Second

	// PruneMargin is added to Config.MaxTTL to give the shortest age PruneOperations accepts:
	// a bound on how long a request can stay in flight (queued in a network, a proxy or a
	// server's buffers) after its sender stopped renewing the lease it carries.
	PruneMargin = 24 * time.Hour
)

// Config tunes a Store. The zero value, and a nil *Config, mean the defaults.
type Config struct {
	// MaxPayloadBytes is the largest payload Publish accepts. Default DefaultMaxPayloadBytes.
	// A driver with a smaller limit of its own (driver.PayloadLimiter) lowers it.
	MaxPayloadBytes int

	// SafetyMargin is how long before the lease's nominal end a holder stops trusting it:
	// a lease acquired with ttl is trusted until (local time when the request was sent) + ttl
	// - SafetyMargin, on a local clock that counts a suspend of the machine (CLOCK_BOOTTIME on
	// Linux, CLOCK_MONOTONIC on macOS). Default: a tenth of the ttl. It must be
	// smaller than every ttl used.
	SafetyMargin time.Duration

	// MaxTTL is the longest TTL this store acquires or renews a lease for; longer ones are
	// refused. Default, and at most, the package's MaxTTL (366 days). It also sets the shortest
	// age PruneOperations accepts (MinPruneAge): give every store that shares a database the
	// same value, or a smaller one.
	MaxTTL time.Duration

	// ReleaseTimeout bounds the release that Run performs at the end, which runs even when the
	// caller's context is already cancelled. Default DefaultReleaseTimeout.
	ReleaseTimeout time.Duration

	// Logger receives the failures that Run cannot return (a failed release). Default
	// slog.Default().
	Logger *slog.Logger

	// SkipMigrate stops New from creating or upgrading the schema.
	SkipMigrate bool

	// AllowNonDurable lets New open a store whose backend reports a setting under which
	// acknowledged generations could be lost in a crash (fsync off, asynchronous commit, an
	// unlogged table, SQLite synchronous below FULL, Redis without appendfsync always, ...).
	// By default New refuses such a store with ErrNotDurable; with AllowNonDurable it logs the
	// settings once per process and goes on. Default false.
	AllowNonDurable bool

	// WaitPollMin and WaitPollMax bound AcquireWait's polling, the fallback for a wake-up the
	// engine's signal did not bring (no signal on this engine, or its listening connection
	// lost): the first retry after a busy answer comes after at most WaitPollMin, and the
	// interval doubles, jittered, up to WaitPollMax. A holder's lease that runs out sooner, by
	// the database's clock, is retried when it runs out whatever these say. Defaults
	// DefaultWaitPollMin and DefaultWaitPollMax; a WaitPollMin above WaitPollMax is lowered to it.
	WaitPollMin, WaitPollMax time.Duration

	// StrictDurability makes New also refuse a store whose durability settings could not be
	// read (a hosted Redis that refuses CONFIG, for example); by default that is logged once
	// per process. It cannot be combined with AllowNonDurable. Default false.
	StrictDurability bool
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	switch {
	case out.MaxPayloadBytes < 0:
		return out, invalid("config", "MaxPayloadBytes %d is negative", out.MaxPayloadBytes)
	case out.SafetyMargin < 0:
		return out, invalid("config", "SafetyMargin %s is negative", out.SafetyMargin)
	case out.ReleaseTimeout < 0:
		return out, invalid("config", "ReleaseTimeout %s is negative", out.ReleaseTimeout)
	case out.MaxTTL != 0 && (out.MaxTTL < MinTTL || out.MaxTTL > MaxTTL):
		return out, invalid("config", "MaxTTL %s is outside %s to %s", out.MaxTTL, MinTTL, MaxTTL)
	case out.WaitPollMin < 0 || out.WaitPollMax < 0:
		return out, invalid("config", "WaitPollMin %s or WaitPollMax %s is negative", out.WaitPollMin, out.WaitPollMax)
	case out.AllowNonDurable && out.StrictDurability:
		return out, invalid("config", "AllowNonDurable and StrictDurability contradict each other")
	}
	if out.MaxTTL == 0 {
		out.MaxTTL = MaxTTL
	}
	if out.MaxPayloadBytes == 0 {
		out.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if out.ReleaseTimeout == 0 {
		out.ReleaseTimeout = DefaultReleaseTimeout
	}
	if out.WaitPollMin == 0 {
		out.WaitPollMin = DefaultWaitPollMin
	}
	if out.WaitPollMax == 0 {
		out.WaitPollMax = DefaultWaitPollMax
	}
	out.WaitPollMin = min(out.WaitPollMin, out.WaitPollMax)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

// Store runs the fenced protocol over one backend. It is safe for concurrent use by multiple
// goroutines; each call uses whatever connection the backend hands it.
type Store struct {
	drv   driver.Driver
	cfg   Config
	waits waitQueues // AcquireWait's waiters, woken by releases through this Store
}

// New returns a Store over drv, creating the schema first unless cfg.SkipMigrate is set.
func New(ctx context.Context, drv driver.Driver, cfg *Config) (*Store, error) {
	if drv == nil {
		return nil, invalid("driver", "is nil")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pl, ok := drv.(driver.PayloadLimiter); ok && pl.MaxPayloadBytes() > 0 && pl.MaxPayloadBytes() < c.MaxPayloadBytes {
		c.MaxPayloadBytes = pl.MaxPayloadBytes()
	}
	s := &Store{drv: drv, cfg: c}
	if !c.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	warnings, err := s.CheckDurability(ctx)
	if err != nil {
		// Not knowing is not the same as knowing it is unsafe; only a strict store refuses.
		if c.StrictDurability {
			return nil, err
		}
		warnOnce(c.Logger, "fenced: could not check the database's durability settings", "error", err.Error())
	}
	if len(warnings) > 0 {
		settings := strings.Join(warnings, "; ")
		if !c.AllowNonDurable {
			return nil, fmt.Errorf("%w: %s; configure the database durably, or accept the risk with Config.AllowNonDurable (fenced --allow-nondurable)",
				ErrNotDurable, settings)
		}
		warnOnce(c.Logger, notDurableWarning, "settings", settings)
	}
	return s, nil
}

// notDurableWarning names, in one sentence, what a store opened with AllowNonDurable risks.
const notDurableWarning = "fenced: this database can lose acknowledged writes in a crash, " +
	"so a token already handed out may be handed out again and a published result may revert"

// warned holds the warnings already logged by this process: a program that opens many stores
// (or a command that opens one per run) should not drown its log in the same sentence.
var warned sync.Map

// warnOnce logs msg with one attribute, unless this process has logged the same already.
func warnOnce(l *slog.Logger, msg, key, value string) {
	if _, seen := warned.LoadOrStore(msg+"\x00"+value, struct{}{}); !seen {
		l.Warn(msg, key, value)
	}
}

// CheckDurability returns one sentence for each engine setting under which acknowledged
// generations could be lost; none when the backend cannot tell.
func (s *Store) CheckDurability(ctx context.Context) ([]string, error) {
	dc, ok := s.drv.(driver.DurabilityChecker)
	if !ok {
		return nil, nil
	}
	w, err := dc.CheckDurability(ctx)
	if err != nil {
		return nil, fmt.Errorf("check durability: %w", err)
	}
	return w, nil
}

// BumpEpoch durably advances the store's recovery epoch and frees every lease. Run it after
// restoring the database from a copy or failing over to a replica that may have lost
// acknowledged commits: every lease issued before it is refused, and every later token
// compares greater than every earlier one. It returns the new epoch.
func (s *Store) BumpEpoch(ctx context.Context) (int64, error) {
	e, err := s.drv.BumpEpoch(ctx)
	if err != nil {
		return 0, mutationError("bump epoch", "", err, nil)
	}
	s.waits.releasedAll() // the bump freed every lease
	return e, nil
}

// Resolution is the final answer for an operation id.
type Resolution struct {
	OpID string
	// Accepted reports whether the publication took effect. When it did not, the id is now
	// recorded as aborted and a late delivery of that publication will be refused.
	Accepted bool
	// Resource and Token are those of the accepted publication.
	Resource   string
	Token      Token
	RecordedAt time.Time
}

// Resolve settles the outcome of a publication by its operation id, typically after
// *OutcomeUnknownError. The answer is final: an id with no recorded outcome is recorded as
// aborted in the same step, so the publication can no longer be accepted.
func (s *Store) Resolve(ctx context.Context, opID string) (Resolution, error) {
	if err := validOpID(opID); err != nil {
		return Resolution{}, err
	}
	op, err := s.drv.ResolveOperation(ctx, opID)
	if err != nil {
		return Resolution{}, mutationError("resolve", opID, err, nil)
	}
	r := Resolution{OpID: opID, Accepted: op.Outcome == driver.OutcomeAccepted, RecordedAt: op.RecordedAt}
	if r.Accepted {
		r.Resource, r.Token = op.Resource, Token{Epoch: op.Epoch, Generation: op.Generation}
	}
	return r, nil
}

// PruneOperations deletes operation records older than age (on the database's clock) and
// returns how many. It refuses an age below MinPruneAge. Once an aborted id is pruned, a late
// delivery of the publication that carried it would be accepted if its lease were still
// current, and Resolve's "aborted" would have been wrong. A publication is accepted only
// while its lease is unexpired, and a lease ends at most MaxTTL after its holder last renewed
// it; MinPruneAge adds PruneMargin for the time the request itself may have been in flight.
// (A holder that keeps renewing the lease after its own publication was resolved as aborted
// keeps that publication acceptable for as long: publish again, or release, first.)
func (s *Store) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	if min := s.MinPruneAge(); age < min {
		return 0, invalid("age", "%s is shorter than the minimum %s (the longest TTL, %s, plus %s): a publication resolved as aborted could still arrive and be accepted",
			age, min, s.maxTTL(), PruneMargin)
	}
	n, err := s.drv.PruneOperations(ctx, age)
	if err != nil {
		return 0, fmt.Errorf("prune operations: %w", err)
	}
	return n, nil
}

// MinPruneAge is the shortest age PruneOperations accepts: Config.MaxTTL plus PruneMargin.
func (s *Store) MinPruneAge() time.Duration { return s.maxTTL() + PruneMargin }

// MaxTTL is the longest TTL this store acquires or renews a lease for (Config.MaxTTL).
func (s *Store) MaxTTL() time.Duration { return s.maxTTL() }

// maxTTL is Config.MaxTTL, defaulted also for a Store not made by New.
func (s *Store) maxTTL() time.Duration {
	if s.cfg.MaxTTL == 0 {
		return MaxTTL
	}
	return s.cfg.MaxTTL
}

// MaxPayloadBytes is the largest payload Publish accepts: the configured limit, or the
// driver's own if that is smaller.
func (s *Store) MaxPayloadBytes() int { return s.cfg.MaxPayloadBytes }

// Driver returns the backend the store runs on.
func (s *Store) Driver() driver.Driver { return s.drv }

// Close closes the driver (which leaves a handle the caller passed to it open).
func (s *Store) Close() error { return s.drv.Close() }

// Migrate creates or upgrades the schema; it is idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.drv.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Provision creates each resource's row at generation 0 if it does not exist yet. It never
// resets an existing generation, so it is safe to run at every start.
func (s *Store) Provision(ctx context.Context, resources ...string) error {
	for _, r := range resources {
		if err := validResource(r); err != nil {
			return err
		}
	}
	for _, r := range resources {
		if err := s.drv.Provision(ctx, r); err != nil {
			return fmt.Errorf("provision %q: %w", r, err)
		}
	}
	return nil
}

// Acquire takes the resource's lease for ttl if it is free or expired, incrementing its
// generation in the same statement. It returns *BusyError (ErrBusy) when an unexpired lease
// prevents it and ErrNotProvisioned when the resource has no row. Any other error is
// operational: it is never reported as busy.
func (s *Store) Acquire(ctx context.Context, resource string, ttl time.Duration) (*Lease, error) {
	if err := validResource(resource); err != nil {
		return nil, err
	}
	if _, err := s.margin(ttl); err != nil {
		return nil, err
	}
	return s.acquireAs(ctx, resource, newID(), ttl)
}

// acquireAs is Acquire with owner, once resource and ttl are known to be valid.
func (s *Store) acquireAs(ctx context.Context, resource, owner string, ttl time.Duration) (*Lease, error) {
	margin, err := s.margin(ttl)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acquire %q: not sent: %w", resource, err)
	}
	sent := trustclock.Now()
	grant, err := s.drv.Acquire(ctx, resource, owner, ttl)
	var busy *driver.BusyError
	switch {
	case errors.As(err, &busy):
		return nil, &BusyError{Resource: resource, Token: Token{Epoch: busy.Epoch, Generation: busy.Generation},
			Generation: busy.Generation, LeaseUntil: busy.LeaseUntil}
	case errors.Is(err, driver.ErrNotFound):
		return nil, fmt.Errorf("acquire %q: %w", resource, ErrNotProvisioned)
	case errors.Is(err, driver.ErrIncarnationChanged):
		return nil, incarnationError(opAcquire, resource, err)
	case err != nil:
		return nil, mutationError(opAcquire, resource, err, func(e *OutcomeUnknownError) { e.Owner = owner })
	}
	return newLease(s, driver.LeaseRef{Resource: resource, Owner: owner, Epoch: grant.Epoch, Generation: grant.Generation},
		grant.LeaseUntil, sent+ttl-margin), nil
}

// LeaseFor returns a handle on an acquisition made elsewhere, for example by another process
// that passed on its owner and generation. The store knows nothing of when it was acquired, so
// the handle has no trust window: its Done channel closes only when this handle learns that the
// lease is gone. Every operation through it is still checked by the database.
func (s *Store) LeaseFor(resource, owner string, token Token) (*Lease, error) {
	if err := validResource(resource); err != nil {
		return nil, err
	}
	if err := ValidateOwner(owner); err != nil {
		return nil, err
	}
	if token.Generation < 1 {
		return nil, invalid("generation", "%d is not a positive integer", token.Generation)
	}
	if token.Epoch < 1 {
		return nil, invalid("epoch", "%d is not a positive integer", token.Epoch)
	}
	return newLease(s, driver.LeaseRef{Resource: resource, Owner: owner, Epoch: token.Epoch, Generation: token.Generation},
		time.Time{}, 0), nil
}

// Show reads the resource's row and the database's clock. It returns ErrNotProvisioned when
// the resource has no row.
func (s *Store) Show(ctx context.Context, resource string) (State, error) {
	if err := validResource(resource); err != nil {
		return State{}, err
	}
	st, err := s.drv.Read(ctx, resource)
	if errors.Is(err, driver.ErrNotFound) {
		return State{}, fmt.Errorf("show %q: %w", resource, ErrNotProvisioned)
	}
	if err != nil {
		return State{}, fmt.Errorf("show %q: %w", resource, err)
	}
	return st, nil
}

// Get returns the published payload and the generation that published it. It returns
// ErrNotProvisioned or ErrNothingPublished when there is none.
func (s *Store) Get(ctx context.Context, resource string) ([]byte, int64, error) {
	if err := validResource(resource); err != nil {
		return nil, 0, err
	}
	payload, gen, err := s.drv.ReadPayload(ctx, resource)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		return nil, 0, fmt.Errorf("get %q: %w", resource, ErrNotProvisioned)
	case err != nil:
		return nil, 0, fmt.Errorf("get %q: %w", resource, err)
	case gen == 0:
		return nil, 0, fmt.Errorf("get %q: %w", resource, ErrNothingPublished)
	}
	return payload, gen, nil
}

func (s *Store) margin(ttl time.Duration) (time.Duration, error) {
	if ttl < MinTTL || ttl > s.maxTTL() {
		return 0, invalid("ttl", "%s is outside %s to %s", ttl, MinTTL, s.maxTTL())
	}
	m := s.cfg.SafetyMargin
	if m == 0 {
		m = ttl / 10
	}
	if m >= ttl {
		return 0, invalid("ttl", "%s is not longer than the safety margin %s", ttl, m)
	}
	return m, nil
}

// refusal builds the error for a refused lease operation from a read of the row taken after
// the refusal. The cause is advisory: the row may have changed again since.
func (s *Store) refusal(ctx context.Context, op string, ref driver.LeaseRef, pub *driver.Publication) error {
	e := &RefusedError{Op: op, Resource: ref.Resource, Epoch: ref.Epoch, Generation: ref.Generation, Cause: CauseUnknown}
	st, err := s.drv.Read(ctx, ref.Resource)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		e.Cause = CauseNotProvisioned
	case err != nil:
		// The refusal is certain; only its cause could not be read.
	default:
		e.CurrentToken = Token{Epoch: st.Epoch, Generation: st.Generation}
		e.CurrentGeneration = st.Generation
		e.CurrentEpoch = max(st.CurrentEpoch, st.Epoch)
		e.Cause = classify(st, ref, pub)
		switch e.Cause {
		case CauseSuperseded, CauseEpochBumped, CauseEpochMismatch:
			// The lease itself is not current: that explains the refusal whatever the id.
		default:
			if pub != nil {
				if o, err := s.drv.ReadOperation(ctx, pub.OpID); err == nil && o.Outcome != "" {
					e.Cause = CauseOperationExists
				}
			}
		}
	}
	return e
}

// classify names the likeliest cause of a refusal from the row read after it. pub is nil
// unless the refused operation was a publication.
//
// Every backend's Read reports the row's token (the epoch and generation of its latest
// acquisition), the store's epoch, and no owner for a lease from an older epoch (the SQL
// backends clear it at the bump; etcd and Redis hide it). Generations only grow, across epochs
// too, so a row token greater than the lease's means a later acquisition; a lease whose epoch
// is older than the store's but not overtaken that way was freed by a bump (or issued in
// history a restore lost, which the bump also fences).
func classify(st State, ref driver.LeaseRef, pub *driver.Publication) Cause {
	row, mine := Token{st.Epoch, st.Generation}, Token{ref.Epoch, ref.Generation}
	current := max(st.CurrentEpoch, st.Epoch)
	switch {
	case st.Owner != "" && st.Owner == ref.Owner && st.Generation == ref.Generation && st.Epoch != ref.Epoch:
		// Owners are fresh per acquisition: this is the lease, presented with another epoch.
		return CauseEpochMismatch
	case ref.Epoch > current:
		return CauseUnknown // an epoch the store has not reached: a token it never issued
	case row.Compare(mine) > 0:
		return CauseSuperseded
	case ref.Epoch < current:
		return CauseEpochBumped
	case row.Compare(mine) < 0:
		return CauseUnknown // a token this row never issued
	case pub != nil && st.PublishedGeneration >= ref.Generation:
		return CauseAlreadyPublished
	case pub != nil && pub.SourceVersion > 0 && st.SourceVersion > pub.SourceVersion:
		return CauseStaleSource
	case st.Owner == "":
		return CauseReleased
	case st.Owner != ref.Owner:
		return CauseUnknown // right generation, wrong owner: not this acquisition
	case !st.LeaseUntil.After(st.Now):
		return CauseExpired
	default:
		return CauseUnknown
	}
}

// newID returns a fresh random identity for one acquisition or operation (128 bits).
func newID() string { return rand.Text() }

func validResource(r string) error {
	switch {
	case r == "":
		return invalid("resource name", "it is empty")
	case len(r) > MaxResourceLen:
		return invalid("resource name", "it is %d bytes long; the limit is %d", len(r), MaxResourceLen)
	case !utf8.ValidString(r):
		return invalid("resource name", "it is not valid UTF-8")
	}
	for _, c := range r {
		if unicode.IsControl(c) {
			return invalid("resource name", "it contains the control character %U", c)
		}
	}
	return nil
}

// ValidateOpID checks a publication's operation id given from outside. It returns
// *InvalidError.
func ValidateOpID(id string) error { return validOpID(id) }

// ValidateOwner checks an owner identity given from outside (a command line, another process,
// a service's client) before anything is sent: 1 to MaxOwnerLen bytes of UTF-8 without control
// characters (spaces and any other script are fine). It returns *InvalidError.
func ValidateOwner(o string) error {
	switch {
	case o == "":
		return invalid("owner", "it is empty")
	case len(o) > MaxOwnerLen:
		return invalid("owner", "it is %d bytes long; the limit is %d", len(o), MaxOwnerLen)
	case !utf8.ValidString(o):
		return invalid("owner", "it is not valid UTF-8")
	}
	for _, c := range o {
		if unicode.IsControl(c) {
			return invalid("owner", "it contains the control character %q", c)
		}
	}
	return nil
}

func validOpID(id string) error { return validToken("operation id", id) }

// validToken checks an identifier: 1 to 128 bytes of printable ASCII without spaces.
func validToken(what, v string) error {
	switch {
	case v == "":
		return invalid(what, "it is empty")
	case len(v) > MaxOwnerLen:
		return invalid(what, "it is %d bytes long; the limit is %d", len(v), MaxOwnerLen)
	}
	for _, c := range v {
		if c <= ' ' || c > '~' {
			return invalid(what, "it contains %q; use printable ASCII without spaces", c)
		}
	}
	return nil
}

// validRole checks a database role name: letters, digits and underscores, not starting with a
// digit, at most 63 bytes, so that it can be quoted safely in every engine.
func validRole(r string) error {
	if r == "" || len(r) > 63 {
		return invalid("role", "%q must be 1 to 63 characters long", r)
	}
	for i, c := range r {
		letter := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return invalid("role", "%q may hold only letters, digits and underscores, and not start with a digit", r)
		}
	}
	return nil
}
