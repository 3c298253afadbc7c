package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Problem types (RFC 9457 "type" members). Each outcome class has one HTTP status, listed in
// the OpenAPI document and in docs/SERVICE.md; clients switch on the type, not the status.
const (
	TypeInvalid               = "urn:fenced:problem:invalid"                // 400: nothing was sent to the database
	TypeUnauthenticated       = "urn:fenced:problem:unauthenticated"        // 401
	TypeForbidden             = "urn:fenced:problem:forbidden"              // 403: by this service's tokens
	TypePermissionDenied      = "urn:fenced:problem:permission-denied"      // 403: by the database, to the service's role
	TypeNotProvisioned        = "urn:fenced:problem:not-provisioned"        // 404
	TypeNothingPublished      = "urn:fenced:problem:nothing-published"      // 404
	TypeNotFound              = "urn:fenced:problem:not-found"              // 404: no such route
	TypeBusy                  = "urn:fenced:problem:busy"                   // 409
	TypeRefused               = "urn:fenced:problem:refused"                // 412: the lease presented is not current
	TypeTooLarge              = "urn:fenced:problem:too-large"              // 413
	TypeUnsupportedMediaType  = "urn:fenced:problem:unsupported-media-type" // 415: a JSON body not sent as application/json
	TypeOutcomeUnknown        = "urn:fenced:problem:outcome-unknown"        // 502: may or may not have happened
	TypeNotApplied            = "urn:fenced:problem:not-applied"            // 503: certainly did not happen
	TypeReadOnly              = "urn:fenced:problem:read-only"              // 503
	TypeIncarnationChanged    = "urn:fenced:problem:incarnation-changed"    // 503: bump the epoch
	TypeUnavailable           = "urn:fenced:problem:unavailable"            // 503: a read failed
	TypeShuttingDown          = "urn:fenced:problem:shutting-down"          // 503
	problemContentType        = "application/problem+json"
	headerRequestID           = "Fenced-Request-Id"
	genericDatabaseTroubleMsg = "the database did not answer as expected; the server's log has the details under this request id"
)

// Problem is an application/problem+json body (RFC 9457) with fenced's extension members.
// Applied is false when the server knows the request changed nothing; it is absent when the
// request succeeded in part of the classes where that question does not arise, and for
// TypeOutcomeUnknown, where the answer is not known.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`

	Applied  *bool  `json:"applied,omitempty"`
	Argument string `json:"argument,omitempty"` // TypeInvalid
	Resource string `json:"resource,omitempty"`

	// TypeBusy: the holder's token and expiry on the database's clock.
	Token      string    `json:"token,omitempty"`
	Epoch      int64     `json:"epoch,omitempty"`
	Generation int64     `json:"generation,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`

	// TypeRefused (and TypeNotProvisioned for a refused lease operation).
	Cause             string `json:"cause,omitempty"`
	CurrentToken      string `json:"current_token,omitempty"`
	CurrentEpoch      int64  `json:"current_epoch,omitempty"`
	CurrentGeneration int64  `json:"current_generation,omitempty"`

	// TypeOutcomeUnknown
	OpID  string `json:"op_id,omitempty"`
	Owner string `json:"owner,omitempty"`

	// TypePermissionDenied: the database role the service connects as, and what it may not do.
	Role      string `json:"role,omitempty"`
	Operation string `json:"operation,omitempty"`

	// TypeIncarnationChanged
	ServerIncarnation   string `json:"server_incarnation,omitempty"`
	RecordedIncarnation string `json:"recorded_incarnation,omitempty"`
}

// no is the value of Problem.Applied when nothing changed.
var no = false

// problemFor maps an error from the store or the driver to its problem. It is the one place
// that decides statuses. mutation says whether the request could have changed the database,
// which decides between "outcome unknown" and "unavailable" for an unclassified error.
func problemFor(err error, mutation bool) Problem {
	var (
		tooBig *http.MaxBytesError
		media  *mediaTypeError
		inv    *fenced.InvalidError
		busy   *fenced.BusyError
		dbusy  *driver.BusyError
		ref    *fenced.RefusedError
		inc    *driver.IncarnationError
		unk    *fenced.OutcomeUnknownError
		denied *driver.PermissionError
	)
	switch {
	case errors.As(err, &tooBig):
		return Problem{Type: TypeTooLarge, Status: http.StatusRequestEntityTooLarge, Title: "request too large",
			Detail: "the request body is larger than " + strconv.FormatInt(tooBig.Limit, 10) + " bytes", Applied: &no}
	case errors.As(err, &media):
		return Problem{Type: TypeUnsupportedMediaType, Status: http.StatusUnsupportedMediaType, Title: "unsupported media type",
			Detail: media.Error(), Applied: &no}
	case errors.As(err, &denied):
		return Problem{Type: TypePermissionDenied, Status: http.StatusForbidden, Title: "the database refused the operation to the service's role",
			Detail: denied.Error(), Role: denied.Role, Operation: denied.Operation, Resource: denied.Resource, Applied: &no}
	case errors.As(err, &inv):
		return Problem{Type: TypeInvalid, Status: http.StatusBadRequest, Title: "invalid request",
			Detail: err.Error(), Argument: inv.Arg, Applied: &no}
	case errors.Is(err, driver.ErrIncarnationChanged):
		// Before refused: for a lease operation it also matches fenced.ErrRefused.
		p := Problem{Type: TypeIncarnationChanged, Status: http.StatusServiceUnavailable,
			Title: "the database was restored or promoted since the last epoch bump", Detail: err.Error(), Applied: &no}
		if errors.As(err, &inc) {
			p.ServerIncarnation, p.RecordedIncarnation = inc.Server, inc.Recorded
		}
		return p
	case errors.As(err, &busy):
		p := Problem{Type: TypeBusy, Status: http.StatusConflict, Title: "resource is busy", Detail: err.Error(),
			Resource: busy.Resource, Applied: &no}
		if busy.Generation > 0 { // 0: a wait that ended before any holder was known
			t := fenced.Token{Epoch: busy.Token.Epoch, Generation: busy.Generation}
			p.Token, p.Epoch, p.Generation, p.LeaseUntil = t.String(), t.Epoch, t.Generation, busy.LeaseUntil.UTC()
		}
		return p
	case errors.As(err, &dbusy):
		t := fenced.Token{Epoch: dbusy.Epoch, Generation: dbusy.Generation}
		return Problem{Type: TypeBusy, Status: http.StatusConflict, Title: "resource is busy", Detail: "resource is busy",
			Token: t.String(), Epoch: t.Epoch, Generation: t.Generation, LeaseUntil: dbusy.LeaseUntil.UTC(), Applied: &no}
	case errors.Is(err, fenced.ErrNotProvisioned), errors.Is(err, driver.ErrNotFound):
		p := Problem{Type: TypeNotProvisioned, Status: http.StatusNotFound, Title: "resource not provisioned",
			Detail: err.Error(), Applied: &no}
		if errors.As(err, &ref) {
			p.Cause, p.Resource = string(ref.Cause), ref.Resource
		}
		return p
	case errors.As(err, &ref):
		p := Problem{Type: TypeRefused, Status: http.StatusPreconditionFailed, Title: "lease is not current",
			Detail: err.Error(), Resource: ref.Resource, Cause: string(ref.Cause), Applied: &no}
		if ref.CurrentToken.Generation > 0 {
			p.CurrentToken = ref.CurrentToken.String()
			p.CurrentEpoch, p.CurrentGeneration = ref.CurrentToken.Epoch, ref.CurrentToken.Generation
		}
		return p
	case errors.Is(err, fenced.ErrNothingPublished):
		return Problem{Type: TypeNothingPublished, Status: http.StatusNotFound, Title: "nothing published", Detail: err.Error()}
	case errors.Is(err, driver.ErrReadOnly):
		return Problem{Type: TypeReadOnly, Status: http.StatusServiceUnavailable, Title: "the database is read-only",
			Detail: driver.ErrReadOnly.Error(), Applied: &no}
	case errors.Is(err, driver.ErrNotApplied):
		return Problem{Type: TypeNotApplied, Status: http.StatusServiceUnavailable, Title: "not applied",
			Detail: "the database could not carry out the request; nothing changed", Applied: &no}
	case !mutation:
		return Problem{Type: TypeUnavailable, Status: http.StatusServiceUnavailable, Title: "database unavailable",
			Detail: genericDatabaseTroubleMsg}
	default:
		p := Problem{Type: TypeOutcomeUnknown, Status: http.StatusBadGateway, Title: "outcome unknown",
			Detail: "the request may have reached the database but no answer came back; " + genericDatabaseTroubleMsg}
		if errors.As(err, &unk) {
			p.OpID, p.Owner, p.Resource = unk.OpID, unk.Owner, unk.Resource
		}
		return p
	}
}

// writeProblem sends p. Problems for 5xx statuses are logged with the error by the caller.
func writeProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if id := w.Header().Get(headerRequestID); id != "" {
		p.Instance = "urn:fenced:request:" + id
	}
	if rec, ok := w.(*recorder); ok {
		rec.prob = &p
	}
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Cache-Control", "no-store")
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="fenced"`)
	}
	if p.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
