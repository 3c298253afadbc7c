package fenced

import (
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// Sentinel errors, for errors.Is. Each typed error below matches exactly one of them.
var (
	// ErrBusy: another owner holds an unexpired lease on the resource. Nothing changed.
	ErrBusy = errors.New("resource is busy")

	// ErrNotProvisioned: the resource has no row. Nothing changed.
	ErrNotProvisioned = errors.New("resource not provisioned")

	// ErrRefused: the database refused a publication, renewal or release because the lease
	// presented is not current. Nothing changed.
	ErrRefused = errors.New("lease is not current")

	// ErrNothingPublished: Get found the resource but no accepted publication.
	ErrNothingPublished = errors.New("nothing published")

	// ErrInvalid: an argument failed validation before anything was sent to the database.
	ErrInvalid = errors.New("invalid argument")

	// ErrOutcomeUnknown: a mutation's request may have reached the database but no answer came
	// back, so it may or may not have taken effect. It is never reported as busy or refused.
	// A publication's outcome can be settled with Store.Resolve and its operation id.
	ErrOutcomeUnknown = errors.New("outcome unknown")

	// ErrIncarnationChanged: the database was restored from a copy or promoted to a new
	// timeline since the last epoch bump, so tokens issued in the lost history could look
	// valid again. Acquisitions are refused until Store.BumpEpoch has run.
	ErrIncarnationChanged = errors.New("the database was restored or promoted since the last epoch bump; bump the epoch first")

	// ErrReadOnly: the server accepts only reads (a hot standby or a read-only replica), so a
	// mutation was refused by the engine and nothing changed. Show and Get work there.
	ErrReadOnly = driver.ErrReadOnly

	// ErrNotDurable: the backend reported a setting under which acknowledged generations could
	// be lost in a crash, and Config.AllowNonDurable is not set.
	ErrNotDurable = errors.New("the database is not configured for durability")

	// ErrLeaseLost: Run stopped trusting its lease (the trust window ended or a renewal was
	// refused) before publishing, so the build's output was discarded unpublished.
	ErrLeaseLost = errors.New("lease lost")
)

// BusyError reports that an unexpired lease prevented acquisition.
// It matches ErrBusy.
type BusyError struct {
	Resource string
	// Token is the holder's token as the database saw it when it refused (advisory).
	Token Token
	// Generation is Token.Generation.
	Generation int64
	// LeaseUntil is the holder's expiry on the database's clock (advisory).
	LeaseUntil time.Time
}

func (e *BusyError) Error() string {
	held := Token{Epoch: e.Token.Epoch, Generation: e.Generation}
	return fmt.Sprintf("resource %q is busy: %s is held until %s",
		e.Resource, held.lease(), e.LeaseUntil.UTC().Format(time.RFC3339Nano))
}

func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Cause is the best-effort reason a lease was refused. It is read after the refused statement
// and may already be out of date when it is returned; only the refusal itself is certain.
type Cause string

const (
	CauseSuperseded       Cause = "superseded"        // a later acquisition took the resource
	CauseEpochBumped      Cause = "epoch_bumped"      // the lease's epoch is older than the store's: a bump since freed it
	CauseEpochMismatch    Cause = "epoch_mismatch"    // this owner and generation hold the lease under another epoch
	CauseExpired          Cause = "expired"           // the lease ran out and nobody took over yet
	CauseAlreadyPublished Cause = "already_published" // this generation has already published
	CauseReleased         Cause = "released"          // the lease was released
	CauseNotProvisioned   Cause = "not_provisioned"   // the resource row does not exist
	CauseStaleSource      Cause = "stale_source"      // the source version is older than the published one
	CauseOperationExists  Cause = "operation_exists"  // the operation id was already accepted or resolved as aborted
	CauseUnknown          Cause = "unknown"           // the row matched on re-read (a race), or a token it never issued
)

// RefusedError reports that the database refused an operation carrying a lease.
// It matches ErrRefused, and also ErrNotProvisioned when the cause is CauseNotProvisioned.
type RefusedError struct {
	Op       string // "publish", "renew", "release" or "publish and release"
	Resource string
	// Epoch and Generation are the refused lease's token. Epoch is 0 when the caller presented
	// a generation without knowing its epoch (the fenced command's --owner/--generation form
	// when the row no longer held that generation); the message then names the generation only.
	Epoch      int64
	Generation int64
	Cause      Cause
	// CurrentToken is the token of the resource's latest acquisition when the cause was read
	// (advisory; zero when it could not be read).
	CurrentToken Token
	// CurrentGeneration is CurrentToken.Generation.
	CurrentGeneration int64
	// CurrentEpoch is the store's epoch when the cause was read, the one every new acquisition
	// gets (advisory).
	CurrentEpoch int64
}

func (e *RefusedError) Error() string {
	mine := Token{Epoch: e.Epoch, Generation: e.Generation}
	msg := fmt.Sprintf("%s %q refused: %s", e.Op, e.Resource, mine.lease())
	switch e.Cause {
	case CauseSuperseded:
		return fmt.Sprintf("%s was superseded by %s", msg, e.CurrentToken.lease())
	case CauseEpochBumped:
		return fmt.Sprintf("%s was acquired before the epoch was bumped to %d", msg, e.CurrentEpoch)
	case CauseEpochMismatch:
		return fmt.Sprintf("%s names the wrong epoch: this owner acquired generation %d in epoch %d (token %s)",
			msg, e.CurrentToken.Generation, e.CurrentToken.Epoch, e.CurrentToken)
	case CauseExpired:
		return msg + " has expired"
	case CauseAlreadyPublished:
		return msg + " has already published"
	case CauseReleased:
		return msg + " was released"
	case CauseNotProvisioned:
		return fmt.Sprintf("%s refused: resource %q is not provisioned", e.Op, e.Resource)
	case CauseStaleSource:
		return msg + " carries a source version older than the published one"
	case CauseOperationExists:
		return msg + ": its operation id was already accepted or resolved as not accepted"
	default:
		if e.CurrentToken.Generation > 0 {
			return fmt.Sprintf("%s is not current (the resource's latest acquisition is %s)", msg, e.CurrentToken.lease())
		}
		return msg + " is not current"
	}
}

func (e *RefusedError) Is(target error) bool {
	return target == ErrRefused || (target == ErrNotProvisioned && e.Cause == CauseNotProvisioned)
}

// InvalidError names an argument that failed validation. It matches ErrInvalid.
type InvalidError struct {
	Arg    string
	Reason string
}

func (e *InvalidError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Arg, e.Reason) }

func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(arg, format string, args ...any) error {
	return &InvalidError{Arg: arg, Reason: fmt.Sprintf(format, args...)}
}

// OutcomeUnknownError reports a mutation that may or may not have taken effect. It matches
// ErrOutcomeUnknown and unwraps to the transport or database error.
type OutcomeUnknownError struct {
	Op       string
	Resource string
	// OpID is the publication's operation id (publications only): pass it to Store.Resolve.
	OpID string
	// Owner is the identity the acquisition would have installed (acquisitions only).
	Owner string
	Err   error
}

func (e *OutcomeUnknownError) Error() string {
	msg := fmt.Sprintf("%s %q: outcome unknown", e.Op, e.Resource)
	if e.OpID != "" {
		msg += fmt.Sprintf(" (operation %s; resolve it to learn whether it was accepted)", e.OpID)
	}
	if e.Owner != "" {
		msg += fmt.Sprintf(" (the lease may have been granted to owner %s: Show tells whether it holds it)", e.Owner)
	}
	return fmt.Sprintf("%s: %v", msg, e.Err)
}

func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// IncarnationError reports that the database was restored from a copy or promoted since the
// last epoch bump. Nothing changed. It matches ErrIncarnationChanged; for an operation that
// carries a lease it also matches ErrRefused, because that lease was issued before the restore
// or promotion and the bump that must follow makes its epoch old: it can never be accepted.
type IncarnationError struct {
	Op       string
	Resource string
	// Server is the server's incarnation now, Recorded the one recorded at the last epoch bump,
	// as the backend names them; both empty when the backend did not say.
	Server, Recorded string
	// Err is the driver's error, which also matches driver.ErrNotApplied.
	Err error
}

func (e *IncarnationError) Error() string {
	what := "the database was restored or promoted since the last epoch bump"
	if e.Server != "" || e.Recorded != "" {
		what += fmt.Sprintf(" (the server's incarnation is %s, the last bump recorded %s)", e.Server, e.Recorded)
	}
	if e.Op == opAcquire {
		return fmt.Sprintf("acquire %q refused: %s; bump the epoch first", e.Resource, what)
	}
	return fmt.Sprintf("%s %q refused: %s, so a lease acquired before can no longer be used", e.Op, e.Resource, what)
}

func (e *IncarnationError) Is(target error) bool {
	return target == ErrIncarnationChanged || (target == ErrRefused && e.Op != opAcquire)
}

func (e *IncarnationError) Unwrap() error { return e.Err }

func incarnationError(op, resource string, err error) *IncarnationError {
	e := &IncarnationError{Op: op, Resource: resource, Err: err}
	var de *driver.IncarnationError
	if errors.As(err, &de) {
		e.Server, e.Recorded = de.Server, de.Recorded
	}
	return e
}
