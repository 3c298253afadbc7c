package fenced

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fenced-dev/fenced/driver"
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
)

// Config tunes a Store. The zero value, and a nil *Config, mean the defaults.
type Config struct {
	// MaxPayloadBytes is the largest payload Publish accepts. Default DefaultMaxPayloadBytes.
	// A driver with a smaller limit of its own (driver.PayloadLimiter) lowers it.
	MaxPayloadBytes int

	// SafetyMargin is how long before the lease's nominal end a holder stops trusting it:
	// a lease acquired with ttl is trusted until (local time when the request was sent) + ttl
	// - SafetyMargin, on the local monotonic clock. Default: a tenth of the ttl. It must be
	// smaller than every ttl used.
	SafetyMargin time.Duration

	// ReleaseTimeout bounds the release that Run performs at the end, which runs even when the
	// caller's context is already cancelled. Default DefaultReleaseTimeout.
	ReleaseTimeout time.Duration

	// Logger receives the failures that Run cannot return (a failed release). Default
	// slog.Default().
	Logger *slog.Logger

	// SkipMigrate stops New from creating or upgrading the schema.
	SkipMigrate bool
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
	}
	if out.MaxPayloadBytes == 0 {
		out.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if out.ReleaseTimeout == 0 {
		out.ReleaseTimeout = DefaultReleaseTimeout
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

// Store runs the fenced protocol over one backend. It is safe for concurrent use by multiple
// goroutines; each call uses whatever connection the backend hands it.
type Store struct {
	drv driver.Driver
	cfg Config
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
	return s, nil
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
	margin, err := s.margin(ttl)
	if err != nil {
		return nil, err
	}
	owner := newOwner()
	sent := time.Now()
	grant, err := s.drv.Acquire(ctx, resource, owner, ttl)
	var busy *driver.BusyError
	switch {
	case errors.As(err, &busy):
		return nil, &BusyError{Resource: resource, Generation: busy.Generation, LeaseUntil: busy.LeaseUntil}
	case errors.Is(err, driver.ErrNotFound):
		return nil, fmt.Errorf("acquire %q: %w", resource, ErrNotProvisioned)
	case err != nil:
		return nil, fmt.Errorf("acquire %q: %w", resource, err)
	}
	return newLease(s, driver.LeaseRef{Resource: resource, Owner: owner, Generation: grant.Generation},
		grant.LeaseUntil, sent.Add(ttl-margin)), nil
}

// LeaseFor returns a handle on an acquisition made elsewhere, for example by another process
// that passed on its owner and generation. The store knows nothing of when it was acquired, so
// the handle has no trust window: its Done channel closes only when this handle learns that the
// lease is gone. Every operation through it is still checked by the database.
func (s *Store) LeaseFor(resource, owner string, generation int64) (*Lease, error) {
	if err := validResource(resource); err != nil {
		return nil, err
	}
	if err := validOwner(owner); err != nil {
		return nil, err
	}
	if generation < 1 {
		return nil, invalid("generation", "%d is not a positive integer", generation)
	}
	return newLease(s, driver.LeaseRef{Resource: resource, Owner: owner, Generation: generation},
		time.Time{}, time.Time{}), nil
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
	if ttl < MinTTL || ttl > MaxTTL {
		return 0, invalid("ttl", "%s is outside %s to %s", ttl, MinTTL, MaxTTL)
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
func (s *Store) refusal(ctx context.Context, op string, ref driver.LeaseRef) error {
	e := &RefusedError{Op: op, Resource: ref.Resource, Generation: ref.Generation, Cause: CauseUnknown}
	st, err := s.drv.Read(ctx, ref.Resource)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		e.Cause = CauseNotProvisioned
	case err != nil:
		// The refusal is certain; only its cause could not be read.
	default:
		e.CurrentGeneration = st.Generation
		e.Cause = classify(st, ref, op == opPublish || op == opPublishAndRelease)
	}
	return e
}

func classify(st State, ref driver.LeaseRef, publishing bool) Cause {
	switch {
	case st.Generation > ref.Generation:
		return CauseSuperseded
	case st.Generation < ref.Generation:
		return CauseUnknown // a generation this row never issued
	case publishing && st.PublishedGeneration >= ref.Generation:
		return CauseAlreadyPublished
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

// newOwner returns a fresh random identity for one acquisition (128 bits).
func newOwner() string { return rand.Text() }

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

func validOwner(o string) error {
	switch {
	case o == "":
		return invalid("owner", "it is empty")
	case len(o) > MaxOwnerLen:
		return invalid("owner", "it is %d bytes long; the limit is %d", len(o), MaxOwnerLen)
	}
	for _, c := range o {
		if c <= ' ' || c > '~' {
			return invalid("owner", "it contains %q; owners are printable ASCII without spaces", c)
		}
	}
	return nil
}
