// Package driver is the small interface between the fenced protocol and a storage engine.
//
// A backend implements Driver with its engine's own atomic primitive: every mutating method is
// exactly one conditional statement (or one transaction) that the engine evaluates, so the
// decision "is this writer still the owner?" is made where the data lives, never in Go. The root
// package fenced adds validation, refusal causes, trust windows and the Run helper on top.
//
// Methods report a refusal (the condition did not match) as a false ok result, never as an
// error; Acquire alone reports its refusal as *BusyError or ErrNotFound. Any other error means
// the operation could not be carried out or its outcome is not known. Drivers must be safe for concurrent use by multiple goroutines.
package driver

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned when the resource has not been provisioned.
var ErrNotFound = errors.New("resource not provisioned")

// BusyError is returned by Acquire when an unexpired lease prevented it. The holder's
// generation and expiry are as the engine saw them when it refused, or as read right after.
type BusyError struct {
	Generation int64
	LeaseUntil time.Time
}

func (e *BusyError) Error() string { return "resource is busy" }

// Driver is one storage engine. Implementations are safe for concurrent use.
//
// Every lease-carrying method matches the row on (resource, owner, generation); times it stores
// are taken from the engine's clock at the moment the statement executes.
type Driver interface {
	// Migrate creates or upgrades the schema. It is idempotent and safe to run concurrently.
	Migrate(ctx context.Context) error

	// Provision creates the resource's row with generation 0 if it does not exist. It never
	// changes an existing row.
	Provision(ctx context.Context, resource string) error

	// Acquire increments the generation and installs owner with an expiry of engine-now + ttl,
	// only where the lease is free or expired. When that condition did not match it returns
	// *BusyError or ErrNotFound; the engine's decision stays in the one conditional statement,
	// and a driver that cannot report why in the same round trip reads the row afterwards.
	Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (Grant, error)

	// Renew sets the expiry to engine-now + ttl only where the lease is current and unexpired.
	Renew(ctx context.Context, lease LeaseRef, ttl time.Duration) (leaseUntil time.Time, ok bool, err error)

	// Publish stores payload as the lease's publication only where the lease is current,
	// unexpired, and its generation has not published yet.
	Publish(ctx context.Context, lease LeaseRef, payload []byte) (ok bool, err error)

	// PublishAndRelease is Publish that also frees the lease, in the same statement.
	PublishAndRelease(ctx context.Context, lease LeaseRef, payload []byte) (ok bool, err error)

	// Release frees the lease only where owner and generation still match. It never deletes the
	// row or resets the generation.
	Release(ctx context.Context, lease LeaseRef) (ok bool, err error)

	// Read returns the resource's row and the engine's current time, or ErrNotFound.
	Read(ctx context.Context, resource string) (State, error)

	// ReadPayload returns the published payload and its generation (0 and nil when nothing has
	// been published), or ErrNotFound.
	ReadPayload(ctx context.Context, resource string) (payload []byte, generation int64, err error)

	// Close releases what the driver itself opened. A handle the caller passed in is left open.
	Close() error
}

// PayloadLimiter is implemented by a driver whose engine cannot store payloads as large as the
// store's configured limit (etcd's request size, for example). The store then refuses larger
// payloads as invalid input before sending anything.
type PayloadLimiter interface {
	MaxPayloadBytes() int
}

// LeaseRef identifies one acquisition.
type LeaseRef struct {
	Resource   string
	Owner      string
	Generation int64
}

// Grant is what a successful acquisition returns.
type Grant struct {
	Generation int64
	// LeaseUntil is the expiry on the engine's clock. It is informational: clients never
	// compare it with their own clock.
	LeaseUntil time.Time
}

// State is one resource's row as read at one moment.
type State struct {
	Resource            string
	Generation          int64
	Owner               string // empty when the lease is free
	LeaseUntil          time.Time
	PublishedGeneration int64
	PublishedAt         time.Time
	PayloadSize         int64
	// Now is the engine's clock when the row was read, so that expiry can be judged against
	// the same clock that judges it in the statements.
	Now time.Time
}

// Held reports whether the row holds a lease that had not expired when it was read.
func (s State) Held() bool {
	return s.Owner != "" && s.LeaseUntil.After(s.Now)
}
