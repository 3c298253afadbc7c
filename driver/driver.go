// Package driver is the small interface between the fenced protocol and a storage engine.
//
// A backend implements Driver with its engine's own atomic primitive: every mutating method is
// exactly one conditional statement (or one transaction) that the engine evaluates, so the
// decision "is this writer still the owner?" is made where the data lives, never in Go. The root
// package fenced adds validation, refusal causes, trust windows and the Run helper on top.
//
// Methods report a refusal (the condition did not match) as a false ok result, never as an
// error; Acquire alone reports its refusal as *BusyError, ErrNotFound or ErrIncarnationChanged.
// Any other error from a mutating method means the outcome is not known, unless it wraps
// ErrNotApplied: the driver then knows the mutation did not take effect (it was never sent, or
// the engine rolled it back). Drivers must be safe for concurrent use by multiple goroutines.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotFound is returned when the resource has not been provisioned.
	ErrNotFound = errors.New("resource not provisioned")

	// ErrNotApplied marks an error after which the mutation certainly did not take effect.
	ErrNotApplied = errors.New("not applied")

	// ErrIncarnationChanged is returned by Acquire when the engine reports a different
	// incarnation (restored, or promoted to a new timeline) than the one recorded at the last
	// epoch bump: old tokens might be valid again until the epoch is advanced.
	ErrIncarnationChanged = errors.New("the database was restored or promoted since the last epoch bump")

	// ErrReadOnly is returned when the server accepts only reads: a hot standby, or a replica
	// set read-only. Nothing was changed.
	ErrReadOnly = errors.New("the database server is read-only (a standby or replica); connect to the primary")
)

// NotApplied marks err so that it matches ErrNotApplied. Its text is err's: "not applied" is
// for errors.Is, not for the people who read the message.
func NotApplied(err error) error {
	if err == nil || errors.Is(err, ErrNotApplied) {
		return err
	}
	return notApplied{err}
}

type notApplied struct{ err error }

func (e notApplied) Error() string   { return e.err.Error() }
func (e notApplied) Unwrap() []error { return []error{e.err, ErrNotApplied} }

// ReadOnly reports err, the engine's refusal to write on a read-only server, as ErrReadOnly
// (and not applied). The message is ErrReadOnly's; err stays reachable with errors.As.
func ReadOnly(err error) error { return NotApplied(readOnly{err}) }

type readOnly struct{ err error }

func (e readOnly) Error() string   { return ErrReadOnly.Error() }
func (e readOnly) Unwrap() []error { return []error{ErrReadOnly, e.err} }

// IncarnationError is ErrIncarnationChanged with both incarnations as the engine names them
// (PostgreSQL: system identifier/timeline).
type IncarnationError struct {
	Server   string // the server's incarnation now
	Recorded string // the incarnation recorded at the last epoch bump
}

func (e *IncarnationError) Error() string {
	return fmt.Sprintf("%v: the server's incarnation is %s, the last epoch bump recorded %s",
		ErrIncarnationChanged, e.Server, e.Recorded)
}

func (e *IncarnationError) Is(target error) bool { return target == ErrIncarnationChanged }

// BusyError is returned by Acquire when an unexpired lease prevented it. The holder's
// token and expiry are as the engine saw them when it refused, or as read right after.
type BusyError struct {
	Epoch      int64
	Generation int64
	LeaseUntil time.Time
}

func (e *BusyError) Error() string { return "resource is busy" }

// Driver is one storage engine. Implementations are safe for concurrent use.
//
// Every lease-carrying method matches the row on (resource, owner, epoch, generation); times it
// stores are taken from the engine's clock at the moment the statement executes.
type Driver interface {
	// Migrate creates or upgrades the schema. It is idempotent and safe to run concurrently.
	// A new store's epoch is the engine's clock in microseconds since 1970 when Migrate creates
	// it, so that a store lost entirely and created again issues tokens above every token of the
	// old one; an existing epoch is never changed. This assumes the engine's clock does not go
	// back across the loss (see BumpEpoch).
	Migrate(ctx context.Context) error

	// Provision creates the resource's row with generation 0 if it does not exist. It never
	// changes an existing row.
	Provision(ctx context.Context, resource string) error

	// Acquire increments the generation, records the current epoch and installs owner with an
	// expiry of engine-now + ttl, only where the lease is free or expired. When that condition
	// did not match it returns *BusyError or ErrNotFound; the engine's decision stays in the
	// one conditional statement, and a driver that cannot report why in the same round trip
	// reads the row afterwards.
	Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (Grant, error)

	// Renew sets the expiry to engine-now + ttl only where the lease is current and unexpired.
	Renew(ctx context.Context, lease LeaseRef, ttl time.Duration) (leaseUntil time.Time, ok bool, err error)

	// Publish stores the publication only where the lease is current and unexpired, its
	// generation has not published yet, the source version (if any) is not older than the
	// published one, and the operation id has not been recorded before. In the same statement
	// or transaction it records the operation id as accepted.
	Publish(ctx context.Context, lease LeaseRef, pub Publication) (ok bool, err error)

	// PublishAndRelease is Publish that also frees the lease, in the same statement.
	PublishAndRelease(ctx context.Context, lease LeaseRef, pub Publication) (ok bool, err error)

	// Release frees the lease only where owner, epoch and generation still match. It never
	// deletes the row or resets the generation.
	Release(ctx context.Context, lease LeaseRef) (ok bool, err error)

	// Read returns the resource's row and the engine's current time, or ErrNotFound.
	Read(ctx context.Context, resource string) (State, error)

	// ReadPayload returns the published payload and its generation (0 and nil when nothing has
	// been published), or ErrNotFound.
	ReadPayload(ctx context.Context, resource string) (payload []byte, generation int64, err error)

	// ResolveOperation returns the recorded outcome of a publication's operation id. When none
	// is recorded it records the id as aborted first, in the same statement or transaction, so
	// that the answer is final: a late delivery of that publication will be refused.
	ResolveOperation(ctx context.Context, opID string) (Operation, error)

	// ReadOperation returns the recorded outcome of an operation id without recording anything;
	// Outcome is empty when none is recorded.
	ReadOperation(ctx context.Context, opID string) (Operation, error)

	// BumpEpoch durably sets the epoch to max(epoch + 1, the engine's clock in microseconds
	// since 1970) and frees every lease, in one transaction, and records the engine's current
	// incarnation where it has one. It returns the new epoch. Taking the clock keeps every epoch
	// at or below the clock (no engine commits two bumps within a microsecond), so a store
	// created after a total loss, later on the same clock, starts above it. If the clock goes
	// back across a loss by more than the time since the last bump, the new store's epoch can
	// be at or below the old one and old tokens can be issued again.
	BumpEpoch(ctx context.Context) (int64, error)

	// PruneOperations deletes operation records older than the engine's now - age and returns
	// how many it deleted.
	PruneOperations(ctx context.Context, age time.Duration) (int64, error)

	// Close releases what the driver itself opened. A handle the caller passed in is left open.
	Close() error
}

// PayloadLimiter is implemented by a driver whose engine cannot store payloads as large as the
// store's configured limit (etcd's request size, for example). The store then refuses larger
// payloads as invalid input before sending anything.
type PayloadLimiter interface {
	MaxPayloadBytes() int
}

// DurabilityChecker is implemented by a driver that can see engine settings under which an
// acknowledged generation could be lost (fsync off, asynchronous commit, an unlogged table).
// Each warning is one sentence naming the setting.
type DurabilityChecker interface {
	CheckDurability(ctx context.Context) (warnings []string, err error)
}

// ReleaseNotifier is implemented by a driver whose engine can signal that a resource's lease
// may have become free (released, published and released, freed by an epoch bump), so that
// waiters in other processes need not poll. signal receives a value after each such event
// that happens after NotifyReleased returned (coalesced; it is never closed), and also when
// the driver lost its way of listening, so that the waiter checks. A signal is a hint: the
// waiter still acquires with the conditional statement and may find the resource busy again.
// stop ends the subscription.
type ReleaseNotifier interface {
	NotifyReleased(ctx context.Context, resource string) (signal <-chan struct{}, stop func(), err error)
}

// Waiter is implemented by a driver whose engine waits for a busy resource itself: a fenced
// service (backend/remote), which queues its waiters first come, first served and wakes them
// on its own releases and its database's signal. fenced.Store.AcquireWait then sends the wait
// to the engine instead of polling it.
type Waiter interface {
	// AcquireWait is Acquire that, while the resource is busy, waits in the engine for up to
	// wait before it answers *BusyError. The driver may wait less than asked (an engine's
	// limit on one wait); the caller asks again. owner is installed as by Acquire, the same
	// one on every call, so that after an unknown outcome the caller can recognise its own
	// acquisition in the row.
	AcquireWait(ctx context.Context, resource, owner string, ttl, wait time.Duration) (Grant, error)
}

// Granter is implemented by a driver that can expose the protocol as database routines and
// grant a role the right to execute them and nothing else on the tables, so that no code
// connected as that role can bypass the fence.
type Granter interface {
	// Grant gives role spec.Access and nothing more, revoking what an earlier Grant gave
	// beyond it, and limits it to spec.Prefixes (none: every resource).
	Grant(ctx context.Context, role string, spec GrantSpec) error
}

// LeaseRef identifies one acquisition: its owner and its token (epoch, generation).
type LeaseRef struct {
	Resource   string
	Owner      string
	Epoch      int64
	Generation int64
}

// Publication is what Publish stores.
type Publication struct {
	Payload []byte
	// OpID names this publication so that an unknown outcome can be resolved later. Always set.
	OpID string
	// SourceVersion, when positive, must not be older than the published one.
	SourceVersion int64
}

// Grant is what a successful acquisition returns.
type Grant struct {
	Epoch      int64
	Generation int64
	// LeaseUntil is the expiry on the engine's clock. It is informational: clients never
	// compare it with their own clock.
	LeaseUntil time.Time
}

// Outcomes of an operation id.
const (
	OutcomeAccepted = "accepted"
	OutcomeAborted  = "aborted"
)

// Operation is a recorded publication outcome.
type Operation struct {
	OpID       string
	Outcome    string // OutcomeAccepted, OutcomeAborted, or "" when nothing is recorded
	Resource   string // set when accepted
	Epoch      int64  // set when accepted
	Generation int64  // set when accepted
	RecordedAt time.Time
}

// State is one resource's row as read at one moment.
type State struct {
	Resource            string
	Epoch               int64 // the epoch of the current generation (0 before the first acquisition)
	Generation          int64
	Owner               string // empty when the lease is free
	LeaseUntil          time.Time
	PublishedEpoch      int64
	PublishedGeneration int64
	PublishedAt         time.Time
	SourceVersion       int64 // of the published payload; 0 when none was given
	PayloadSize         int64
	// CurrentEpoch is the store's epoch: every new acquisition gets it.
	CurrentEpoch int64
	// Now is the engine's clock when the row was read, so that expiry can be judged against
	// the same clock that judges it in the statements.
	Now time.Time
}

// Held reports whether the row holds a lease that had not expired when it was read.
func (s State) Held() bool {
	return s.Owner != "" && s.LeaseUntil.After(s.Now)
}
