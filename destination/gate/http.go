package gate

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

// Problem is the application/problem+json body (RFC 9457) of a refused request. Resource and
// Token are those of the request (when they could be parsed), Current the mark that refused
// it (for a stale token).
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail"`
	Resource string `json:"resource,omitempty"`
	Token    string `json:"token,omitempty"`
	Current  string `json:"current,omitempty"`
}

// Problem types, one per way a token is refused.
const (
	ProblemMalformed = "urn:fenced:problem:malformed-token"  // 400
	ProblemStale     = "urn:fenced:problem:stale-token"      // 409
	ProblemUnknown   = "urn:fenced:problem:unknown-resource" // 422
	// ProblemOutcomeUnknown: the COMMIT got no answer; the write may or may not have
	// committed, so a client must read before it retries.
	ProblemOutcomeUnknown = "urn:fenced:problem:outcome-unknown" // 500
)

// TxHandler does a service's write inside the transaction that checked its token. It returns
// an error to roll back; the response it writes is sent only after the commit succeeded.
type TxHandler func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error

type tokenKey struct{}

type requestToken struct {
	resource string
	token    fenced.Token
}

// TokenFrom returns the token that Handler accepted for the request.
func TokenFrom(ctx context.Context) (resource string, token fenced.Token, ok bool) {
	rt, ok := ctx.Value(tokenKey{}).(requestToken)
	return rt.resource, rt.token, ok
}

// Handler is the middleware for a participating service. For each request it reads the
// Fencing-Token header, opens a transaction, checks the token there (Check), runs next with
// the transaction and commits. A missing or malformed header is answered 400, a stale token
// 409, an unknown resource 422, each with an application/problem+json body naming the
// resource and, for 409, the current mark; the mark is then unchanged and next never runs. An
// error from next rolls back and is answered 500 unless next already chose a status. What next
// writes is buffered and sent after the commit, so a client never sees success for a write
// that did not commit.
func (g *Gate) Handler(next TxHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resource, token, err := destination.FromRequest(r)
		if err != nil {
			WriteProblem(w, "", fenced.Token{}, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), tokenKey{}, requestToken{resource, token}))
		buf := &bufferedWriter{header: http.Header{}}
		err = g.Do(r.Context(), resource, token, func(tx *sql.Tx) error { return next(buf, r, tx) })
		if err != nil {
			if buf.code >= 400 && !isRefusal(err) {
				buf.flush(w) // next answered the error itself
				return
			}
			WriteProblem(w, resource, token, err)
			return
		}
		buf.flush(w)
	})
}

func isRefusal(err error) bool {
	return errors.Is(err, destination.ErrStale) || errors.Is(err, destination.ErrMalformed) ||
		errors.Is(err, destination.ErrUnknownResource)
}

// WriteProblem answers err as application/problem+json: 400 for a malformed token, 409 for a
// stale one, 422 for an unknown resource, 500 of type ProblemOutcomeUnknown for a commit whose
// outcome is unknown (fenced.ErrOutcomeUnknown), 500 for anything else, which was rolled back
// (its text is not sent).
func WriteProblem(w http.ResponseWriter, resource string, token fenced.Token, err error) {
	p := Problem{Resource: resource}
	if resource != "" {
		p.Token = token.String()
	}
	var stale *destination.StaleError
	switch {
	case errors.As(err, &stale):
		p.Type, p.Title, p.Status = ProblemStale, "Stale fencing token", http.StatusConflict
		p.Current = stale.Current.String()
		p.Detail = "The resource has been taken over by a newer holder; this write was refused and nothing changed."
	case errors.Is(err, destination.ErrMalformed):
		p.Type, p.Title, p.Status = ProblemMalformed, "Malformed fencing token", http.StatusBadRequest
		p.Detail = err.Error()
	case errors.Is(err, destination.ErrUnknownResource):
		p.Type, p.Title, p.Status = ProblemUnknown, "Unknown resource", http.StatusUnprocessableEntity
		p.Detail = "This service keeps no fencing mark for the resource; nothing changed."
	case errors.Is(err, fenced.ErrOutcomeUnknown):
		p.Type, p.Title, p.Status = ProblemOutcomeUnknown, "Write outcome unknown", http.StatusInternalServerError
		p.Detail = "The commit got no answer: the write may or may not have committed; read the resource before retrying."
	default:
		p.Type, p.Title, p.Status = "about:blank", "Internal Server Error", http.StatusInternalServerError
		p.Detail = "The write failed and was rolled back."
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// bufferedWriter holds a response until the transaction has committed.
type bufferedWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}

func (b *bufferedWriter) flush(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	if b.code == 0 {
		b.code = http.StatusNoContent
	}
	w.WriteHeader(b.code)
	_, _ = w.Write(b.body.Bytes())
}

// FenceHandler answers a holder's fence on acquisition (destination.Remote): it raises the
// mark of the Fencing-Token's resource to its token and answers 204 with the Fencing-Mark
// header (destination.MarkHeader) naming the resource and that mark, which Remote requires as
// proof that a gate fenced; or it refuses like Handler (400, 409, 422) leaving the mark
// unchanged. Mount it on a path of its own, POST only.
func (g *Gate) FenceHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resource, token, err := destination.FromRequest(r)
		if err == nil {
			err = g.Fence(r.Context(), resource, token)
		}
		if err != nil {
			WriteProblem(w, resource, token, err)
			return
		}
		// The statement left the mark at token: it raised it there or found it equal.
		w.Header().Set(destination.MarkHeader, destination.FormatHeader(resource, token))
		w.WriteHeader(http.StatusNoContent)
	})
}
