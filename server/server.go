// Package server is fenced's HTTP/JSON service: every protocol operation over one store, for
// programs in any language, described by the OpenAPI document served at /openapi.json.
//
// The service adds no protocol of its own. Every mutation is the store's (or, for an
// acquisition with an owner chosen by the client, the driver's) one conditional statement;
// the server only translates requests and answers. Errors are application/problem+json
// (RFC 9457) with one status per outcome class (see problem.go), so that a client can tell
// "certainly did not happen" (4xx, and 503 with "applied": false) from "may have happened"
// (502 outcome-unknown, or a lost reply).
//
// A mutation runs to its end even when the client hangs up, bounded by
// Options.MutationTimeout: the database's answer then decides, never a half-sent request.
// TestMutationOutlivesTheClient holds a publication in the driver across the hang-up.
package server

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// OpenAPI is the service's OpenAPI 3.1 document, kept in the repository as openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Request headers of the publish operations, which carry the raw payload as their body.
// HeaderOwner's value is percent-encoded (RFC 3986, as url.PathEscape writes it), since an
// owner may be any UTF-8 and a header value is ASCII; an ASCII owner without "%" is its own
// encoding.
const (
	HeaderOwner         = "Fenced-Owner"
	HeaderToken         = "Fenced-Token"
	HeaderOpID          = "Fenced-Op-Id"
	HeaderSourceVersion = "Fenced-Source-Version"
	HeaderGeneration    = "Fenced-Generation" // on GET .../payload
)

// Defaults for Options.
const (
	DefaultMutationTimeout = 30 * time.Second
	DefaultMaxWait         = 5 * time.Minute
	// maxJSONBytes bounds every JSON request body; only a payload is larger.
	maxJSONBytes = 64 << 10
)

// Options configures a Server. The zero value and nil mean the defaults.
type Options struct {
	// Tokens authenticates requests. Nil: no authentication, and only clients on a loopback
	// address are answered (everyone else gets 403).
	Tokens *Tokens

	// Logger receives one line per request that failed on the database's side. Default
	// slog.Default().
	Logger *slog.Logger

	// MutationTimeout bounds a mutation, which runs on even if the client hangs up. Default
	// DefaultMutationTimeout.
	MutationTimeout time.Duration

	// MaxWait is the longest wait_ms an acquisition may ask for; longer ones are invalid.
	// Default DefaultMaxWait.
	MaxWait time.Duration

	// UnsafeAnyPruneAge lets an admin prune operation records of any age, as the driver
	// interface allows; by default the store's MinPruneAge is enforced. Only for tests that
	// run the conformance suite through the service.
	UnsafeAnyPruneAge bool

	// SyncConnections lets a client ask (HeaderSyncConnection, sent by the remote driver's
	// SyncTransport) that its HTTP/1.1 connection be served by a loop on one goroutine after
	// its first request, which saves net/http's hand-offs between goroutines (the
	// connection's limits and timeouts are the http.Server's). Such connections are ended by
	// StopWaiting and waited for by WaitAnswered. Default false: the header is ignored.
	SyncConnections bool
}

// Server serves one store. It is safe for concurrent use; build it with New.
type Server struct {
	store *fenced.Store
	drv   driver.Driver
	opts  Options
	log   *slog.Logger
	mux   *http.ServeMux

	metrics  *metrics
	recent   recent          // for the dashboard
	stopping context.Context // cancelled by StopWaiting
	stop     context.CancelFunc
	parked   parkedSet // waiters on connections taken over from net/http
	// hook, set by tests before the first request, sees the parked waiters' moments.
	hook func(event string)
	// takenOver, set by tests before the first request, runs just after a connection has been
	// taken over from net/http (Hijack), which then no longer tracks it.
	takenOver func()
}

// StopWaiting ends every waiting acquisition with 503 shutting-down (Retry-After), and makes
// new ones fail the same way, so that a graceful shutdown (http.Server.Shutdown) does not wait
// for them. Requests that do not wait are not affected. It does not wait for the answers:
// http.Server.Shutdown waits for those of ordinary requests, WaitAnswered for those of the
// waiters whose connections the service took over from net/http.
func (s *Server) StopWaiting() { s.stop() }

// New returns a Server over store, which stays the caller's to close.
func New(store *fenced.Store, opts *Options) (*Server, error) {
	if store == nil {
		return nil, errors.New("server: store is nil")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MutationTimeout < 0 {
		return nil, fmt.Errorf("server: MutationTimeout %s is negative", o.MutationTimeout)
	}
	if o.MutationTimeout == 0 {
		o.MutationTimeout = DefaultMutationTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxWait < 0 {
		return nil, fmt.Errorf("server: MaxWait %s is negative", o.MaxWait)
	}
	if o.MaxWait == 0 {
		o.MaxWait = DefaultMaxWait
	}
	s := &Server{store: store, drv: store.Driver(), opts: o, log: o.Logger, mux: http.NewServeMux(), metrics: newMetrics()}
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.routes()
	return s, nil
}

// Handler returns the service's HTTP handler.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

func (s *Server) routes() {
	s.mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(OpenAPI)
	})
	s.handle("GET /v1/info", "info", RoleReader, s.info)
	s.handle("PUT /v1/resources/{name}", "provision", RoleWorker, s.provision)
	s.handle("GET /v1/resources/{name}", "show", RoleReader, s.show)
	s.handle("GET /v1/resources/{name}/payload", "get", RoleReader, s.get)
	s.handle("POST /v1/resources/{name}/acquire", "acquire", RoleWorker, s.acquire)
	s.handle("POST /v1/resources/{name}/renew", "renew", RoleWorker, s.renew)
	s.handle("POST /v1/resources/{name}/publish", "publish", RoleWorker, s.publish(false))
	s.handle("POST /v1/resources/{name}/publish-and-release", "publish-and-release", RoleWorker, s.publish(true))
	s.handle("POST /v1/resources/{name}/release", "release", RoleWorker, s.release)
	s.handle("GET /v1/operations/{id}", "read-operation", RoleReader, s.readOperation)
	s.handle("POST /v1/operations/{id}/resolve", "resolve", RoleWorker, s.resolve)
	s.handle("POST /v1/operations/prune", "prune", RoleAdmin, s.prune)
	s.handle("POST /v1/epoch/bump", "bump-epoch", RoleAdmin, s.bump)
	s.handle("GET /metrics", "metrics", RoleReader, s.metrics.handler().ServeHTTP)
	s.handle("GET /v1/dashboard", "dashboard", RoleReader, s.dashboard)
	// The page holds no data; its script reads /v1/dashboard with the token typed into it.
	s.mux.HandleFunc("GET /{$}", s.dashboardPage)
	// Probes answer without a token, as orchestrators call them; they reveal no resource.
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, Problem{Type: TypeNotFound, Status: http.StatusNotFound, Title: "no such operation",
			Detail: fmt.Sprintf("%s %s is not an operation of this service; see /openapi.json", r.Method, r.URL.Path), Applied: &no})
	})
}

// handle registers h behind request ids and authorisation: the caller needs at least role
// need, and a route with a resource name needs a token whose prefixes cover it.
func (s *Server) handle(pattern, op string, need Role, h http.HandlerFunc) {
	s.mux.HandleFunc(pattern, func(rw http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.metrics.inflight.Inc()
		w := &recorder{ResponseWriter: rw}
		// The closure holds strings, not r: a parked waiter keeps it until it answers, and r
		// holds net/http's connection with its buffers.
		name, path := r.PathValue("name"), ""
		// Only with --log-requests: slog's arguments are allocated even when the level is off.
		logged := s.log.Enabled(r.Context(), slog.LevelDebug)
		if logged {
			path = r.URL.EscapedPath()
		}
		w.finish = func() {
			took := time.Since(start)
			s.metrics.inflight.Dec()
			s.metrics.observe(op, w, took)
			s.recent.remember(op, name, w)
			outcome := "ok"
			switch {
			case w.prob != nil:
				outcome = w.prob.Type
			case w.gone:
				outcome = "client-gone"
			}
			if logged {
				s.log.Debug("fenced serve: request", "request_id", w.Header().Get(headerRequestID), "operation", op,
					"path", path, "status", w.status, "outcome", outcome, "duration", took)
			}
		}
		defer func() {
			if !w.parked { // else the parked waiter finishes when it answers
				w.finish()
			}
		}()
		w.requestID[0] = rand.Text()[:16]
		w.Header()[headerRequestID] = w.requestID[:] // the canonical name: Set would only check it
		p, prob := s.authenticate(r)
		if prob != nil {
			writeProblem(w, r, *prob)
			return
		}
		if prob := p.authorize(need, name); prob != nil {
			writeProblem(w, r, *prob)
			return
		}
		// On the recorder, not in the request's context: r.WithContext would copy the request.
		w.principal = p
		h(w, r)
	})
}

// fail writes err's problem and logs the server-side failures.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error, mutation bool) {
	p := problemFor(err, mutation)
	if p.Status >= 500 {
		s.log.Warn("fenced serve: request failed", "request_id", w.Header().Get(headerRequestID),
			"method", r.Method, "path", r.URL.Path, "problem", p.Type, "error", err.Error())
	}
	writeProblem(w, r, p)
}

// mutationContext detaches a mutation from the client's connection: once sent to the
// database, its answer is waited for (up to MutationTimeout) even if the client hung up.
func (s *Server) mutationContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx := r.Context()
	if ctx.Done() != nil { // a looped request's never ends (loop.serve): nothing to detach
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(ctx, s.opts.MutationTimeout)
}

// Header values shared by every answer that has them: handlers and writers replace a
// header's values, never write into them.
var (
	valueJSON    = []string{"application/json"}
	valueNoStore = []string{"no-store"}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h["Content-Type"], h["Cache-Control"] = valueJSON, valueNoStore
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// readJSON decodes a small JSON body strictly: unknown fields and trailing data are invalid.
// The body must be declared application/json: a web page can send any other type across
// origins without asking the browser's permission first (a "simple" request), this one not.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); !isJSON(ct) {
		return &mediaTypeError{got: ct}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return err
		}
		return &fenced.InvalidError{Arg: "request body", Reason: "it is not the expected JSON object: " + err.Error()}
	}
	if dec.More() {
		return &fenced.InvalidError{Arg: "request body", Reason: "it holds more than one JSON value"}
	}
	return nil
}

// isJSON reports whether a Content-Type header names application/json (parameters allowed),
// without mime.ParseMediaType's allocations on every request.
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// mediaTypeError is a JSON operation's request whose body is not declared application/json.
type mediaTypeError struct{ got string }

func (e *mediaTypeError) Error() string {
	if e.got == "" {
		return "the request body has no Content-Type; send Content-Type: application/json"
	}
	return fmt.Sprintf("the request body's Content-Type is %q; send Content-Type: application/json", e.got)
}

// Millis is a duration in milliseconds as JSON carries it; fractions are allowed.
type Millis float64

func (m Millis) duration(arg string) (time.Duration, error) {
	f := float64(m) * float64(time.Millisecond)
	if math.IsNaN(f) || f < 1 || f >= math.MaxInt64 {
		return 0, &fenced.InvalidError{Arg: arg, Reason: fmt.Sprintf("%v ms is not a positive duration", float64(m))}
	}
	return time.Duration(math.Round(f)), nil
}

func millis(d time.Duration) Millis { return Millis(float64(d) / float64(time.Millisecond)) }

// Lease is an acquisition as the service reports it.
type Lease struct {
	Resource   string    `json:"resource"`
	Owner      string    `json:"owner"`
	Token      string    `json:"token"`
	Epoch      int64     `json:"epoch"`
	Generation int64     `json:"generation"`
	LeaseUntil time.Time `json:"lease_until"`
}

// AcquireRequest is the body of POST /v1/resources/{name}/acquire.
type AcquireRequest struct {
	TTL Millis `json:"ttl_ms"`
	// Owner is the identity to install; empty: the server draws a fresh random one. A client
	// that may retry after a lost reply chooses its own, to recognise its acquisition (and,
	// after a waiting acquisition's lost reply, to release it).
	Owner string `json:"owner,omitempty"`
	// Wait is how long to wait while the resource is busy (fenced.Store.AcquireWait), at most
	// Options.MaxWait; 0 answers busy at once. Every attempt of the wait installs Owner when
	// it is given (fenced.AsOwner).
	Wait Millis `json:"wait_ms,omitempty"`
}

// LeaseRequest is the body of renew and release.
type LeaseRequest struct {
	Owner string `json:"owner"`
	Token string `json:"token"`
	TTL   Millis `json:"ttl_ms,omitempty"` // renew only
}

// Info is GET /v1/info.
type Info struct {
	MaxPayloadBytes    int      `json:"max_payload_bytes"`
	MaxTTL             Millis   `json:"max_ttl_ms"`
	MaxWait            Millis   `json:"max_wait_ms"` // the longest wait_ms an acquisition may ask for
	MinPruneAge        Millis   `json:"min_prune_age_ms"`
	DurabilityWarnings []string `json:"durability_warnings"`
	// DurabilityError is set when the settings could not be read.
	DurabilityError string `json:"durability_error,omitempty"`
}

// State is GET /v1/resources/{name}: the row and the database's clock.
type State struct {
	Resource            string    `json:"resource"`
	Token               string    `json:"token"`
	Epoch               int64     `json:"epoch"`
	Generation          int64     `json:"generation"`
	Owner               string    `json:"owner,omitempty"`
	LeaseUntil          time.Time `json:"lease_until,omitzero"`
	Held                bool      `json:"held"`
	PublishedToken      string    `json:"published_token,omitempty"`
	PublishedEpoch      int64     `json:"published_epoch"`
	PublishedGeneration int64     `json:"published_generation"`
	PublishedAt         time.Time `json:"published_at,omitzero"`
	SourceVersion       int64     `json:"source_version"`
	PayloadSize         int64     `json:"payload_size"`
	CurrentEpoch        int64     `json:"current_epoch"`
	Now                 time.Time `json:"now"`
}

// Published is the answer to publish and publish-and-release.
type Published struct {
	Resource   string `json:"resource"`
	Token      string `json:"token"`
	Epoch      int64  `json:"epoch"`
	Generation int64  `json:"generation"`
	OpID       string `json:"op_id"`
	Released   bool   `json:"released"`
}

// Operation is an operation id's recorded outcome: "accepted", "aborted", or "none" (read only).
type Operation struct {
	OpID       string    `json:"op_id"`
	Outcome    string    `json:"outcome"`
	Resource   string    `json:"resource,omitempty"`
	Token      string    `json:"token,omitempty"`
	Epoch      int64     `json:"epoch,omitempty"`
	Generation int64     `json:"generation,omitempty"`
	RecordedAt time.Time `json:"recorded_at,omitzero"`
}

const outcomeNone = "none"

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	in := Info{MaxPayloadBytes: s.store.MaxPayloadBytes(), MaxTTL: millis(s.store.MaxTTL()), MaxWait: millis(s.opts.MaxWait),
		MinPruneAge: millis(s.store.MinPruneAge()), DurabilityWarnings: []string{}}
	ws, err := s.store.CheckDurability(r.Context())
	if err != nil {
		in.DurabilityError = "the database's durability settings could not be read"
		s.log.Warn("fenced serve: durability check failed", "error", err.Error())
	}
	in.DurabilityWarnings = append(in.DurabilityWarnings, ws...)
	writeJSON(w, http.StatusOK, in)
}

func (s *Server) provision(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	if err := s.store.Provision(ctx, r.PathValue("name")); err != nil {
		s.fail(w, r, err, true)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) show(w http.ResponseWriter, r *http.Request) {
	st, err := s.store.Show(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	writeJSON(w, http.StatusOK, stateJSON(st, r.PathValue("name")))
}

func stateJSON(st fenced.State, name string) State {
	out := State{Resource: st.Resource, Token: fenced.Token{Epoch: st.Epoch, Generation: st.Generation}.String(),
		Epoch: st.Epoch, Generation: st.Generation, Owner: st.Owner, LeaseUntil: st.LeaseUntil, Held: st.Held(),
		PublishedEpoch: st.PublishedEpoch, PublishedGeneration: st.PublishedGeneration, PublishedAt: st.PublishedAt,
		SourceVersion: st.SourceVersion, PayloadSize: st.PayloadSize, CurrentEpoch: st.CurrentEpoch, Now: st.Now}
	if st.Resource == "" {
		out.Resource = name
	}
	if st.PublishedGeneration > 0 {
		out.PublishedToken = fenced.Token{Epoch: st.PublishedEpoch, Generation: st.PublishedGeneration}.String()
	}
	return out
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	payload, gen, err := s.store.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Cache-Control", "no-store")
	h.Set(HeaderGeneration, strconv.FormatInt(gen, 10))
	h.Set("Content-Length", strconv.Itoa(len(payload)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(payload)
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	resource := r.PathValue("name")
	var req AcquireRequest
	if err := readJSON(w, r, &req); err != nil {
		s.fail(w, r, err, false)
		return
	}
	ttl, err := req.TTL.duration("ttl_ms")
	if err == nil && (ttl < fenced.MinTTL || ttl > s.store.MaxTTL()) {
		err = &fenced.InvalidError{Arg: "ttl_ms", Reason: fmt.Sprintf("%s is outside %s to %s", ttl, fenced.MinTTL, s.store.MaxTTL())}
	}
	if err == nil {
		err = fenced.ValidateResource(resource)
	}
	if err == nil && req.Owner != "" {
		err = fenced.ValidateOwner(req.Owner)
	}
	if err == nil && req.Wait != 0 {
		var wait time.Duration
		switch wait, err = req.Wait.duration("wait_ms"); {
		case err != nil:
		case wait > s.opts.MaxWait:
			err = &fenced.InvalidError{Arg: "wait_ms", Reason: fmt.Sprintf("%s is longer than this service's limit %s", wait, s.opts.MaxWait)}
		default:
			s.acquireWait(w, r, resource, req.Owner, ttl, wait)
			return
		}
	}
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	if req.Owner == "" {
		req.Owner = rand.Text()
	}
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	// The driver directly, not Store.Acquire: the owner is the client's choice, so that a
	// client whose reply is lost can recognise its own acquisition.
	g, err := s.drv.Acquire(ctx, resource, req.Owner, ttl)
	if err != nil {
		p := problemFor(err, true)
		if p.Type == TypeOutcomeUnknown {
			p.Owner, p.Resource = req.Owner, resource
			s.log.Warn("fenced serve: acquire outcome unknown", "request_id", w.Header().Get(headerRequestID), "error", err.Error())
		} else if p.Status >= 500 {
			s.log.Warn("fenced serve: acquire failed", "request_id", w.Header().Get(headerRequestID), "error", err.Error())
		}
		if p.Type == TypeBusy {
			p.Resource = resource
			p.Detail = (&fenced.BusyError{Resource: resource, Token: fenced.Token{Epoch: p.Epoch, Generation: p.Generation},
				Generation: p.Generation, LeaseUntil: p.LeaseUntil}).Error()
		}
		writeProblem(w, r, p)
		return
	}
	t := fenced.Token{Epoch: g.Epoch, Generation: g.Generation}
	writeJSON(w, http.StatusOK, Lease{Resource: resource, Owner: req.Owner, Token: t.String(), Epoch: g.Epoch,
		Generation: g.Generation, LeaseUntil: g.LeaseUntil})
}

// ready answers 200 when the database answers a read, with its durability warnings.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if _, err := s.drv.ReadOperation(ctx, "fenced-readyz"); err != nil {
		s.log.Warn("fenced serve: not ready", "error", err.Error())
		writeProblem(w, r, Problem{Type: TypeUnavailable, Status: http.StatusServiceUnavailable, Title: "database unavailable",
			Detail: "the database did not answer a read"})
		return
	}
	ws, err := s.store.CheckDurability(ctx)
	out := map[string]any{"status": "ready", "durability_warnings": append([]string{}, ws...)}
	if err != nil {
		out["durability_error"] = "the database's durability settings could not be read"
	}
	writeJSON(w, http.StatusOK, out)
}

// leaseFor builds a handle on the lease a request names; every check is the database's.
func (s *Server) leaseFor(resource, owner, token string) (*fenced.Lease, error) {
	if token == "" {
		return nil, &fenced.InvalidError{Arg: "token", Reason: "it is missing; give the lease's token as EPOCH.GENERATION"}
	}
	t, err := fenced.ParseToken(token)
	if err != nil {
		return nil, err
	}
	return s.store.LeaseFor(resource, owner, t)
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	var req LeaseRequest
	if err := readJSON(w, r, &req); err != nil {
		s.fail(w, r, err, false)
		return
	}
	l, err := s.leaseFor(r.PathValue("name"), req.Owner, req.Token)
	var ttl time.Duration
	if err == nil {
		ttl, err = req.TTL.duration("ttl_ms")
	}
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	if err := l.Renew(ctx, ttl); err != nil {
		s.fail(w, r, err, true)
		return
	}
	writeJSON(w, http.StatusOK, Lease{Resource: l.Resource(), Owner: l.Owner(), Token: l.Token().String(),
		Epoch: l.Epoch(), Generation: l.Generation(), LeaseUntil: l.LeaseUntil()})
}

func (s *Server) publish(release bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		owner, err := url.PathUnescape(r.Header.Get(HeaderOwner))
		if err != nil {
			err = &fenced.InvalidError{Arg: "owner", Reason: "the " + HeaderOwner + " header is not percent-encoded correctly"}
		}
		var l *fenced.Lease
		if err == nil {
			l, err = s.leaseFor(r.PathValue("name"), owner, r.Header.Get(HeaderToken))
		}
		opts := []fenced.PublishOption{}
		opID := r.Header.Get(HeaderOpID)
		if err == nil && opID != "" {
			err = fenced.ValidateOpID(opID)
		}
		if opID == "" {
			// Drawn here rather than by the store, so that every answer can name it.
			opID = rand.Text()
		}
		opts = append(opts, fenced.WithOpID(opID))
		if v := r.Header.Get(HeaderSourceVersion); err == nil && v != "" {
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil || n < 0 {
				err = &fenced.InvalidError{Arg: "source version", Reason: fmt.Sprintf("%q is not a non-negative integer", v)}
			}
			opts = append(opts, fenced.WithSourceVersion(n))
		}
		if err != nil {
			s.fail(w, r, err, false)
			return
		}
		payload, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.store.MaxPayloadBytes())))
		if tooBig := (*http.MaxBytesError)(nil); err != nil && !errors.As(err, &tooBig) {
			// A body cut short or badly framed (chunked) is the request's fault, not the database's.
			err = &fenced.InvalidError{Arg: "request body", Reason: "it could not be read: " + err.Error()}
		}
		if err != nil {
			s.fail(w, r, err, false)
			return
		}
		ctx, cancel := s.mutationContext(r)
		defer cancel()
		if release {
			if err = l.PublishAndRelease(ctx, payload, opts...); err == nil {
				s.metrics.released(l.Resource())
			}
		} else {
			err = l.Publish(ctx, payload, opts...)
		}
		if err != nil {
			s.fail(w, r, err, true)
			return
		}
		writeJSON(w, http.StatusOK, Published{Resource: l.Resource(), Token: l.Token().String(), Epoch: l.Epoch(),
			Generation: l.Generation(), OpID: opID, Released: release})
	}
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	var req LeaseRequest
	if err := readJSON(w, r, &req); err != nil {
		s.fail(w, r, err, false)
		return
	}
	if req.TTL != 0 {
		s.fail(w, r, &fenced.InvalidError{Arg: "ttl_ms", Reason: "a release takes no TTL"}, false)
		return
	}
	l, err := s.leaseFor(r.PathValue("name"), req.Owner, req.Token)
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		s.fail(w, r, err, true)
		return
	}
	s.metrics.released(l.Resource())
	w.WriteHeader(http.StatusNoContent)
}

func operationJSON(op driver.Operation) Operation {
	out := Operation{OpID: op.OpID, Outcome: op.Outcome, RecordedAt: op.RecordedAt}
	if out.Outcome == "" {
		out.Outcome = outcomeNone
	}
	if op.Outcome == driver.OutcomeAccepted {
		out.Resource, out.Epoch, out.Generation = op.Resource, op.Epoch, op.Generation
		out.Token = fenced.Token{Epoch: op.Epoch, Generation: op.Generation}.String()
	}
	return out
}

// visible reports whether the caller may see an accepted operation of resource: an operation
// id is not a resource name, so the prefix check happens on the answer.
func visible(w http.ResponseWriter, op Operation) bool {
	return op.Resource == "" || principalOf(w).covers(op.Resource)
}

func (s *Server) readOperation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := fenced.ValidateOpID(id); err != nil {
		s.fail(w, r, err, false)
		return
	}
	op, err := s.drv.ReadOperation(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	if op.OpID == "" {
		op.OpID = id
	}
	out := operationJSON(op)
	if !visible(w, out) {
		writeProblem(w, r, forbidden("this token's prefixes do not cover the operation's resource"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	res, err := s.store.Resolve(ctx, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err, true)
		return
	}
	op := driver.Operation{OpID: res.OpID, Outcome: driver.OutcomeAborted, RecordedAt: res.RecordedAt}
	if res.Accepted {
		op.Outcome, op.Resource, op.Epoch, op.Generation = driver.OutcomeAccepted, res.Resource, res.Token.Epoch, res.Token.Generation
	}
	out := operationJSON(op)
	if !visible(w, out) {
		writeProblem(w, r, forbidden("this token's prefixes do not cover the operation's resource"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// PruneRequest is the body of POST /v1/operations/prune.
type PruneRequest struct {
	Age Millis `json:"age_ms"`
}

func (s *Server) prune(w http.ResponseWriter, r *http.Request) {
	var req PruneRequest
	if err := readJSON(w, r, &req); err != nil {
		s.fail(w, r, err, false)
		return
	}
	age, err := req.Age.duration("age_ms")
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	var n int64
	if s.opts.UnsafeAnyPruneAge {
		n, err = s.drv.PruneOperations(ctx, age)
	} else {
		n, err = s.store.PruneOperations(ctx, age)
	}
	if err != nil {
		s.fail(w, r, err, true)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"deleted": n})
}

func (s *Server) bump(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.mutationContext(r)
	defer cancel()
	e, err := s.store.BumpEpoch(ctx)
	if err != nil {
		s.fail(w, r, err, true)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"epoch": e})
}
