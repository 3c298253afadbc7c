package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/artifact"
)

// Exit codes, the same for every command.
const (
	ExitOK          = 0 // done
	ExitOperational = 1 // the database could not be reached or an I/O error occurred
	ExitUsage       = 2 // usage or invalid input; nothing was sent to the database
	ExitBusy        = 3 // another owner holds an unexpired lease
	ExitNotFound    = 4 // the resource is not provisioned, or nothing was published
	ExitRefused     = 5 // the lease presented is not current; nothing changed
	ExitUnknown     = 6 // the request may have reached the database but no answer came back
	ExitViolations  = 7 // fenced torture found violations of the protocol's invariants
	ExitDenied      = 8 // the database refused the operation to this role (fenced grant), or a service to this token; nothing changed
)

// exitCodesHelp is printed under every command's help.
const exitCodesHelp = `Exit codes:
  0  done
  1  operational error (database unreachable, I/O, a write sent to a read-only standby,
     an acquisition after a restore or promotion until "fenced epoch bump", a bearer
     token that "fenced serve" does not know, a run interrupted by SIGINT, SIGTERM or
     SIGHUP; while still waiting with --wait such an interrupt ends the wait: 3)
  2  usage or invalid input (bad flag, argument, duration, generation, token, payload
     too large)
  3  busy: another owner holds an unexpired lease
  4  not found: the resource is not provisioned (also when a lease operation is refused
     because the resource does not exist), or get found nothing published (or, with
     --pointer, a payload that is not an artifact pointer)
  5  refused: the lease presented is not current (superseded, expired, released, or this
     generation already published, a stale source version, an operation id already
     resolved, an epoch bumped since, the database restored or promoted since), or run
     lost its lease; nothing changed
  6  outcome unknown: the request may have reached the database but the reply was lost;
     for publish, "fenced resolve ID" settles it; for acquire, the message names the
     owner, and "fenced show" tells whether it holds the lease
  7  torture found violations (a model check that did not finish is 1, not 0)
  8  permission denied: the database refused the operation to the role connected (not
     granted to it by "fenced grant --as", or the resource is outside its --prefix), or
     "fenced serve" refused it to the bearer token (its role or prefixes); nothing changed
  run passes on the exit code of a command that failed`

// usageError is input that was rejected before anything was sent to the database.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCode maps an error to the process's exit code. The order matters: a refusal caused by a
// missing resource matches both ErrRefused and ErrNotProvisioned and is reported as not found.
func exitCode(err error) int {
	var (
		usage      *usageError
		command    *commandExit
		violations *violationsError
	)
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &violations):
		return ExitViolations
	case errors.As(err, &command):
		return command.code
	case errors.As(err, &usage), errors.Is(err, fenced.ErrInvalid):
		return ExitUsage
	case errors.Is(err, fenced.ErrPermissionDenied):
		return ExitDenied
	case errors.Is(err, fenced.ErrBusy):
		return ExitBusy
	case errors.Is(err, fenced.ErrNotProvisioned), errors.Is(err, fenced.ErrNothingPublished),
		errors.Is(err, destination.ErrUnknownResource), errors.Is(err, artifact.ErrNotArtifact):
		return ExitNotFound
	case errors.Is(err, fenced.ErrOutcomeUnknown):
		return ExitUnknown
	case errors.Is(err, fenced.ErrRefused), errors.Is(err, fenced.ErrLeaseLost), errors.Is(err, destination.ErrStale):
		return ExitRefused
	case errors.Is(err, errors.ErrUnsupported):
		return ExitUsage
	default:
		return ExitOperational
	}
}

// sentence renders err as the one line printed on stderr.
func sentence(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ") // one line, whatever the driver said
	msg = strings.TrimRight(msg, ".")
	if errors.Is(err, fenced.ErrNotProvisioned) {
		msg += `; run "fenced provision" first`
	}
	return "fenced: " + msg + "."
}
