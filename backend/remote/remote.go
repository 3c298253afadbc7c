// Package remote is a fenced driver that speaks to a fenced service (fenced serve) over its
// HTTP/JSON API, so that everything built on drivers (fenced.Store, Run, the fenced command,
// the conformance suite) works through the network unchanged.
//
// The service evaluates every mutation in one statement of its own database; this driver only
// classifies what it learns:
//   - a request that never left (no connection, or the context ended before one was obtained)
//     certainly did not happen: the error wraps driver.ErrNotApplied;
//   - an answer whose problem body says "applied": false (invalid, unauthorised, read-only,
//     the database could not carry it out) did not happen either;
//   - everything else after the request was handed to a connection (a lost or cut reply, a
//     502 outcome-unknown, a proxy's own error page) may have happened: a plain error, which
//     fenced.Store reports as outcome unknown.
//
// Go's transport retries a request on a reused connection only when it knows nothing was
// written; mutations carry no Idempotency-Key header, so it never replays one that was.
//
// The package has no server of its own to test against; its tests, the conformance suite run
// through a service included, live in the server module (server/*_test.go). Only the
// comparison of its hand-written HTTP with net/http's (plain_test.go) is here.
package remote

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// Problem types this driver acts on (see the server package).
const (
	typeBusy               = "urn:fenced:problem:busy"
	typeRefused            = "urn:fenced:problem:refused"
	typeNotProvisioned     = "urn:fenced:problem:not-provisioned"
	typeNothingPublished   = "urn:fenced:problem:nothing-published"
	typeReadOnly           = "urn:fenced:problem:read-only"
	typeIncarnationChanged = "urn:fenced:problem:incarnation-changed"
	typePermissionDenied   = "urn:fenced:problem:permission-denied"
	typeForbidden          = "urn:fenced:problem:forbidden"
)

// Options configures Open. Nil means the defaults.
type Options struct {
	// Client sends the requests. Default: a client of its own with a transport cloned from
	// http.DefaultTransport (so Close can close its idle connections).
	Client *http.Client
	// BearerToken is sent as "Authorization: Bearer ...". Default: $FENCED_TOKEN is not read
	// here; the caller passes it.
	BearerToken string
	// TLS configures HTTPS for the default client (for a private CA, for example).
	TLS *tls.Config
	// SyncTransport makes the default client write each request and read its answer on the
	// calling goroutine, over HTTP/1.1 connections kept between requests, instead of
	// net/http's Transport and its reading and writing goroutines per connection: a cycle
	// through the service then waits for fewer goroutine wake-ups (docs/SERVICE.md, Numbers).
	// It reads no proxy settings and speaks no HTTP/2. Not with Client. Default false (the
	// fenced command's --db http:// client turns it on unless a proxy applies to the URL).
	SyncTransport bool
}

// Driver is a client of one fenced service. It is safe for concurrent use by multiple
// goroutines.
type Driver struct {
	base   *url.URL
	prefix string // base as written, without a trailing slash: each request's path follows it
	client *http.Client
	// sync is the driver's own SyncTransport, called without http.Client, whose redirect,
	// cookie and timeout handling the driver does not use (a redirect is never followed);
	// nil otherwise.
	sync *syncTransport
	// plain says that sync writes the driver's requests itself (plainShape), to addr, for
	// hostname, each path after plainBase (the URL's path as written, without a trailing
	// slash).
	plain                     bool
	addr, hostname, plainBase string
	token                     string
	own                       interface{ CloseIdleConnections() } // closed by Close; nil when the caller gave the client
	maxPay                    atomic.Int64
	// maxWait is the service's limit on one wait (from /v1/info), 0 until asked.
	maxWait atomic.Int64
	closed  atomic.Bool
}

// errClosed is returned by every call after Close, as by a closed database handle.
var errClosed = errors.New("the fenced service client is closed")

var (
	_ driver.Driver = (*Driver)(nil)
	_ driver.Waiter = (*Driver)(nil)
)

// defaultMaxWait is the wait limit assumed of a service whose /v1/info does not name one
// (the service's default).
const defaultMaxWait = 5 * time.Minute

// Open returns a driver for the service at rawURL (http:// or https://, with an optional
// path prefix). It sends nothing until the first call.
func Open(rawURL string, opts *Options) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("fenced service URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("fenced service URL: the scheme must be http or https, not %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("fenced service URL: it names no host")
	}
	if u.User != nil {
		return nil, errors.New("fenced service URL: credentials in the URL are not sent; pass a bearer token instead")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		// Paths are appended to the URL as it is written; a query would end up in their middle.
		return nil, errors.New("fenced service URL: it takes no query or fragment, only a scheme, a host and an optional path prefix")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	d := &Driver{base: u, prefix: strings.TrimSuffix(u.String(), "/"), client: o.Client, token: o.BearerToken}
	if o.SyncTransport {
		if d.client != nil {
			return nil, errors.New("fenced service client: SyncTransport applies to the default client only, not to one given in Client")
		}
		st := newSyncTransport(o.TLS, u.Scheme == "https")
		d.own, d.sync = st, st
		d.hostname = u.Hostname()
		port := u.Port()
		switch {
		case port != "":
		case u.Scheme == "https":
			port = "443"
		default:
			port = "80"
		}
		d.addr = net.JoinHostPort(d.hostname, port)
		d.plainBase = strings.TrimSuffix(u.EscapedPath(), "/")
		// The request target is the path as written, as net/http would send it.
		if t, err := url.Parse(d.prefix + "/v1/x"); err == nil && t.RequestURI() == d.plainBase+"/v1/x" && plainHost(u.Host) {
			d.plain = true
		}
		d.client = &http.Client{Transport: st}
	}
	if d.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// One host only: keep as many idle connections as there are concurrent callers, not
		// the default 2, so that concurrent callers reuse connections instead of dialling
		// (and leaving TIME_WAIT sockets) on nearly every request.
		tr.MaxIdleConnsPerHost = tr.MaxIdleConns
		if o.TLS != nil {
			tr.TLSClientConfig = o.TLS
		}
		d.own = tr
		d.client = &http.Client{Transport: tr}
	}
	// A redirect would re-send a mutation elsewhere; the service never redirects.
	c := *d.client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	d.client = &c
	return d, nil
}

// Close closes the idle connections of the driver's own transport.
func (d *Driver) Close() error {
	d.closed.Store(true)
	if d.own != nil {
		d.own.CloseIdleConnections()
	}
	return nil
}

// escape writes a resource name or operation id as one path segment. "." and ".." are
// spelled out, since a client or server would otherwise treat them as path steps.
func escape(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// problem is the part of an application/problem+json body the driver reads.
type problem struct {
	Type                string    `json:"type"`
	Status              int       `json:"status"`
	Detail              string    `json:"detail"`
	Applied             *bool     `json:"applied"`
	Epoch               int64     `json:"epoch"`
	Generation          int64     `json:"generation"`
	LeaseUntil          time.Time `json:"lease_until"`
	ServerIncarnation   string    `json:"server_incarnation"`
	Role                string    `json:"role"`
	Operation           string    `json:"operation"`
	Resource            string    `json:"resource"`
	RecordedIncarnation string    `json:"recorded_incarnation"`
}

// reply is an HTTP answer read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
	prob   *problem // set when the body is application/problem+json
}

// err words an answer that is not the operation's success. It does not name the operation:
// the caller (fenced.Store) does, as it does for every driver.
func (r *reply) err() error {
	if r.prob == nil {
		return fmt.Errorf("the service answered %d without a problem body", r.status)
	}
	msg := r.prob.Detail
	if msg == "" {
		msg = r.prob.Type
	}
	err := fmt.Errorf("the service answered %d: %s", r.status, msg)
	if r.prob.Type == typeForbidden {
		return &forbiddenError{err: err}
	}
	return err
}

// forbiddenError is the service's refusal of a request to the bearer token presented (its
// role or its prefixes do not cover it): permission denied, as a database's refusal to its
// role is, and nothing changed. Its text is the service's, without the operation's name.
type forbiddenError struct{ err error }

func (e *forbiddenError) Error() string { return e.err.Error() }
func (e *forbiddenError) Unwrap() []error {
	return []error{driver.ErrPermission, driver.ErrNotApplied, e.err}
}

// mutationErr classifies a failed mutation's answer: certain when the service says nothing
// changed, unknown otherwise.
func (r *reply) mutationErr() error {
	err := r.err()
	if r.prob == nil {
		return err
	}
	switch r.prob.Type {
	case typeReadOnly:
		return driver.ReadOnly(err)
	case typeIncarnationChanged:
		return driver.NotApplied(&driver.IncarnationError{Server: r.prob.ServerIncarnation, Recorded: r.prob.RecordedIncarnation})
	case typePermissionDenied:
		return &driver.PermissionError{Role: r.prob.Role, Operation: r.prob.Operation, Resource: r.prob.Resource, Err: err}
	}
	if r.prob.Applied != nil && !*r.prob.Applied {
		return driver.NotApplied(err)
	}
	return err
}

// do sends one request and reads the whole answer. A transport error is reported as not
// applied only when no connection had been obtained for the request, so nothing was sent.
func (d *Driver) do(ctx context.Context, method, path string, header http.Header, body []byte) (*reply, error) {
	if d.closed.Load() {
		return nil, driver.NotApplied(errClosed)
	}
	var sent atomic.Bool // a connection was chosen: from then on the outcome may be unknown
	if d.sync == nil {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) { sent.Store(true) },
		})
	}
	if p, ok := d.plainRequest(method, path, header, body); ok {
		a, err := d.sync.roundTripPlain(ctx, &p, &sent)
		if err != nil {
			err = &url.Error{Op: method[:1] + strings.ToLower(method[1:]), URL: d.prefix + path, Err: err}
			if !sent.Load() {
				return nil, driver.NotApplied(d.unreachable(err))
			}
			return nil, err
		}
		return d.reply(a.status, a.header, a.body), nil
	}
	target := d.prefix + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, driver.NotApplied(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	var resp *http.Response
	if d.sync != nil {
		if resp, err = d.sync.roundTrip(req, &sent); err != nil {
			// As http.Client reports it.
			err = &url.Error{Op: method[:1] + strings.ToLower(method[1:]), URL: target, Err: err}
		}
	} else {
		resp, err = d.client.Do(req)
	}
	if err != nil {
		if !sent.Load() {
			return nil, driver.NotApplied(d.unreachable(err))
		}
		return nil, err
	}
	defer resp.Body.Close()
	var b []byte
	if rb, ok := resp.Body.(*readBody); ok {
		b = rb.b
	} else if b, err = io.ReadAll(resp.Body); err != nil {
		return nil, fmt.Errorf("reading the service's answer: %w", err)
	}
	return d.reply(resp.StatusCode, resp.Header, b), nil
}

// reply is an answer read in full, its problem body decoded.
func (d *Driver) reply(status int, h http.Header, b []byte) *reply {
	r := &reply{status: status, header: h, body: b}
	if status >= 300 && strings.HasPrefix(h.Get("Content-Type"), "application/problem+json") {
		var p problem
		if json.Unmarshal(b, &p) == nil && p.Type != "" {
			r.prob = &p
		}
	}
	return r
}

// plainRequest is the request for d's SyncTransport to write itself, if it may.
func (d *Driver) plainRequest(method, path string, header http.Header, body []byte) (plainRequest, bool) {
	if !d.plain {
		return plainRequest{}, false
	}
	p := plainRequest{addr: d.addr, name: d.hostname, method: method, host: d.base.Host,
		target: d.plainBase + path, header: header, token: d.token, body: body}
	return p, plainShape(&p)
}

// jsonHeader and noHeader are the headers of requests with and without a JSON body, shared
// by all of them: nothing writes to a request's header after it is built.
var (
	jsonHeader = http.Header{"Content-Type": {"application/json"}}
	noHeader   = http.Header{}
)

// connError is a failure to connect to the service, in the user's terms; the transport's
// error stays reachable with errors.As.
type connError struct {
	msg string
	err error
}

func (e *connError) Error() string { return e.msg }
func (e *connError) Unwrap() error { return e.err }

// unreachable words a request that got no connection: a failed lookup or dial names the
// service's host and the cause alone, not the URL and every layer of the transport's error.
// Anything else (a TLS handshake refused, the context ended) is returned as it is.
func (d *Driver) unreachable(err error) error {
	var (
		dns   *net.DNSError
		errno syscall.Errno
		op    *net.OpError
		cause string
	)
	switch {
	case errors.As(err, &dns):
		cause = dns.Error()
	case errors.As(err, &op) && op.Op == "dial":
		cause = op.Err.Error()
		if errors.As(op.Err, &errno) {
			cause = errno.Error()
		}
	default:
		return err
	}
	return &connError{msg: fmt.Sprintf("cannot connect to the fenced service at %s: %s", d.base.Host, cause), err: err}
}

func (d *Driver) doJSON(ctx context.Context, method, path string, in any) (*reply, error) {
	if in == nil {
		return d.do(ctx, method, path, noHeader, nil)
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, driver.NotApplied(err)
	}
	return d.do(ctx, method, path, jsonHeader, body)
}

func decode(r *reply, v any) error {
	if err := json.Unmarshal(r.body, v); err != nil {
		return fmt.Errorf("the service's answer is not the expected JSON: %w", err)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type info struct {
	MaxPayloadBytes    int64    `json:"max_payload_bytes"`
	MaxWait            float64  `json:"max_wait_ms"`
	DurabilityWarnings []string `json:"durability_warnings"`
	DurabilityError    string   `json:"durability_error"`
}

func (d *Driver) info(ctx context.Context) (info, error) {
	r, err := d.doJSON(ctx, http.MethodGet, "/v1/info", nil)
	if err != nil {
		return info{}, err
	}
	if r.status != http.StatusOK {
		return info{}, r.err()
	}
	var in info
	if err := decode(r, &in); err != nil {
		return info{}, err
	}
	d.maxPay.Store(in.MaxPayloadBytes)
	maxWait := time.Duration(in.MaxWait * float64(time.Millisecond))
	if maxWait <= 0 {
		maxWait = defaultMaxWait
	}
	d.maxWait.Store(int64(maxWait))
	return in, nil
}

// Migrate checks that the service answers; the service migrated its database at start.
func (d *Driver) Migrate(ctx context.Context) error {
	_, err := d.info(ctx)
	return err
}

// MaxPayloadBytes is the service's limit once Migrate or CheckDurability has asked for it
// (0, no limit of the driver's own, before).
func (d *Driver) MaxPayloadBytes() int { return int(min(d.maxPay.Load(), math.MaxInt32)) }

// CheckDurability returns the warnings of the service's database.
func (d *Driver) CheckDurability(ctx context.Context) ([]string, error) {
	in, err := d.info(ctx)
	if err != nil {
		return nil, err
	}
	if in.DurabilityError != "" {
		return nil, errors.New("fenced service: " + in.DurabilityError)
	}
	return in.DurabilityWarnings, nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	r, err := d.doJSON(ctx, http.MethodPut, "/v1/resources/"+escape(resource), nil)
	if err != nil {
		return err
	}
	if r.status != http.StatusNoContent && r.status != http.StatusOK {
		return r.mutationErr()
	}
	return nil
}

type lease struct {
	Epoch      int64     `json:"epoch"`
	Generation int64     `json:"generation"`
	LeaseUntil time.Time `json:"lease_until"`
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	return d.acquire(ctx, resource, acquireBody{Owner: owner, TTL: ms(ttl)})
}

// AcquireWait sends the acquisition with wait_ms, so that the service waits for the resource
// in its own queue (first come, first served among its waiters), at most the service's limit
// on one wait (max_wait_ms of /v1/info, asked once). An acquisition that waited is answered
// on a connection the service then closes. fenced.Store.AcquireWait sends a longer wait again,
// and that request joins the back of the service's queue.
func (d *Driver) AcquireWait(ctx context.Context, resource, owner string, ttl, wait time.Duration) (driver.Grant, error) {
	limit := time.Duration(d.maxWait.Load())
	if limit == 0 {
		if _, err := d.info(ctx); err != nil {
			return driver.Grant{}, driver.NotApplied(fmt.Errorf("reading the service's limit on waits: %w", err))
		}
		limit = time.Duration(d.maxWait.Load())
	}
	wait = max(min(wait, limit), time.Millisecond)
	return d.acquire(ctx, resource, acquireBody{Owner: owner, TTL: ms(ttl), Wait: ms(wait)})
}

// acquireBody is an acquisition's JSON body; wait_ms is left out when 0 (never sent as 0).
type acquireBody struct {
	Owner string  `json:"owner"`
	TTL   float64 `json:"ttl_ms"`
	Wait  float64 `json:"wait_ms,omitempty"`
}

func (d *Driver) acquire(ctx context.Context, resource string, body acquireBody) (driver.Grant, error) {
	r, err := d.doJSON(ctx, http.MethodPost, "/v1/resources/"+escape(resource)+"/acquire", body)
	if err != nil {
		return driver.Grant{}, err
	}
	if r.status == http.StatusOK {
		var l lease
		if err := decode(r, &l); err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{Epoch: l.Epoch, Generation: l.Generation, LeaseUntil: l.LeaseUntil}, nil
	}
	if r.prob != nil {
		switch r.prob.Type {
		case typeBusy:
			return driver.Grant{}, &driver.BusyError{Epoch: r.prob.Epoch, Generation: r.prob.Generation, LeaseUntil: r.prob.LeaseUntil}
		case typeNotProvisioned:
			return driver.Grant{}, driver.ErrNotFound
		}
	}
	return driver.Grant{}, r.mutationErr()
}

func leaseBody(l driver.LeaseRef) map[string]any {
	return map[string]any{"owner": l.Owner, "token": tokenText(l)}
}

// tokenText is l's token as the service reads it, EPOCH.GENERATION, in one allocation.
func tokenText(l driver.LeaseRef) string {
	var b [41]byte
	return string(strconv.AppendInt(append(strconv.AppendInt(b[:0], l.Epoch, 10), '.'), l.Generation, 10))
}

// refused reports whether the answer is the database's refusal of a lease operation.
func refused(r *reply) bool {
	return r.prob != nil && (r.prob.Type == typeRefused || r.prob.Type == typeNotProvisioned)
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	body := leaseBody(l)
	body["ttl_ms"] = ms(ttl)
	r, err := d.doJSON(ctx, http.MethodPost, "/v1/resources/"+escape(l.Resource)+"/renew", body)
	switch {
	case err != nil:
		return time.Time{}, false, err
	case r.status == http.StatusOK:
		var out lease
		if err := decode(r, &out); err != nil {
			return time.Time{}, false, err
		}
		return out.LeaseUntil, true, nil
	case refused(r):
		return time.Time{}, false, nil
	}
	return time.Time{}, false, r.mutationErr()
}

func (d *Driver) publish(ctx context.Context, verb string, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	// One array holds the values (any UTF-8 owner is percent-encoded).
	v := [...]string{"application/octet-stream", url.PathEscape(l.Owner), tokenText(l), pub.OpID, ""}
	h := http.Header{"Content-Type": v[0:1:1], "Fenced-Owner": v[1:2:2], "Fenced-Token": v[2:3:3], "Fenced-Op-Id": v[3:4:4]}
	if pub.SourceVersion > 0 {
		v[4] = strconv.FormatInt(pub.SourceVersion, 10)
		h["Fenced-Source-Version"] = v[4:5:5]
	}
	payload := pub.Payload
	if payload == nil {
		payload = []byte{}
	}
	r, err := d.do(ctx, http.MethodPost, "/v1/resources/"+escape(l.Resource)+"/"+verb, h, payload)
	switch {
	case err != nil:
		return false, err
	case r.status == http.StatusOK:
		// An acceptance names the operation; anything else (a proxy's page) proves nothing.
		var out struct {
			OpID string `json:"op_id"`
		}
		if err := decode(r, &out); err != nil {
			return false, err
		}
		if out.OpID != pub.OpID {
			return false, fmt.Errorf("the service's answer names operation %q, not %q", out.OpID, pub.OpID)
		}
		return true, nil
	case refused(r):
		return false, nil
	}
	return false, r.mutationErr()
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, "publish", l, pub)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, "publish-and-release", l, pub)
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	r, err := d.doJSON(ctx, http.MethodPost, "/v1/resources/"+escape(l.Resource)+"/release", leaseBody(l))
	switch {
	case err != nil:
		return false, err
	case r.status == http.StatusNoContent || r.status == http.StatusOK:
		return true, nil
	case refused(r):
		return false, nil
	}
	return false, r.mutationErr()
}

type state struct {
	Resource            string    `json:"resource"`
	Epoch               int64     `json:"epoch"`
	Generation          int64     `json:"generation"`
	Owner               string    `json:"owner"`
	LeaseUntil          time.Time `json:"lease_until"`
	PublishedEpoch      int64     `json:"published_epoch"`
	PublishedGeneration int64     `json:"published_generation"`
	PublishedAt         time.Time `json:"published_at"`
	SourceVersion       int64     `json:"source_version"`
	PayloadSize         int64     `json:"payload_size"`
	CurrentEpoch        int64     `json:"current_epoch"`
	Now                 time.Time `json:"now"`
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	r, err := d.doJSON(ctx, http.MethodGet, "/v1/resources/"+escape(resource), nil)
	if err != nil {
		return driver.State{}, err
	}
	if r.status != http.StatusOK {
		if r.prob != nil && r.prob.Type == typeNotProvisioned {
			return driver.State{}, driver.ErrNotFound
		}
		return driver.State{}, r.err()
	}
	var s state
	if err := decode(r, &s); err != nil {
		return driver.State{}, err
	}
	return driver.State(s), nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	r, err := d.doJSON(ctx, http.MethodGet, "/v1/resources/"+escape(resource)+"/payload", nil)
	if err != nil {
		return nil, 0, err
	}
	if r.status != http.StatusOK {
		switch {
		case r.prob != nil && r.prob.Type == typeNotProvisioned:
			return nil, 0, driver.ErrNotFound
		case r.prob != nil && r.prob.Type == typeNothingPublished:
			return nil, 0, nil
		}
		return nil, 0, r.err()
	}
	gen, err := strconv.ParseInt(r.header.Get("Fenced-Generation"), 10, 64)
	if err != nil || gen < 1 {
		return nil, 0, errors.New("the service's answer has no valid Fenced-Generation header")
	}
	return r.body, gen, nil
}

type operation struct {
	OpID       string    `json:"op_id"`
	Outcome    string    `json:"outcome"`
	Resource   string    `json:"resource"`
	Epoch      int64     `json:"epoch"`
	Generation int64     `json:"generation"`
	RecordedAt time.Time `json:"recorded_at"`
}

func (o operation) driver() driver.Operation {
	out := driver.Operation(o)
	if out.Outcome == "none" {
		out.Outcome = ""
	}
	return out
}

func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	r, err := d.doJSON(ctx, http.MethodPost, "/v1/operations/"+escape(opID)+"/resolve", nil)
	if err != nil {
		return driver.Operation{}, err
	}
	if r.status != http.StatusOK {
		return driver.Operation{}, r.mutationErr()
	}
	var o operation
	if err := decode(r, &o); err != nil {
		return driver.Operation{}, err
	}
	return o.driver(), nil
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	r, err := d.doJSON(ctx, http.MethodGet, "/v1/operations/"+escape(opID), nil)
	if err != nil {
		return driver.Operation{}, err
	}
	if r.status != http.StatusOK {
		return driver.Operation{}, r.err()
	}
	var o operation
	if err := decode(r, &o); err != nil {
		return driver.Operation{}, err
	}
	return o.driver(), nil
}

func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	r, err := d.doJSON(ctx, http.MethodPost, "/v1/epoch/bump", nil)
	if err != nil {
		return 0, err
	}
	if r.status != http.StatusOK {
		return 0, r.mutationErr()
	}
	var out struct {
		Epoch int64 `json:"epoch"`
	}
	if err := decode(r, &out); err != nil {
		return 0, err
	}
	return out.Epoch, nil
}

func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	r, err := d.doJSON(ctx, http.MethodPost, "/v1/operations/prune", map[string]any{"age_ms": ms(age)})
	if err != nil {
		return 0, err
	}
	if r.status != http.StatusOK {
		return 0, r.mutationErr()
	}
	var out struct {
		Deleted int64 `json:"deleted"`
	}
	if err := decode(r, &out); err != nil {
		return 0, err
	}
	return out.Deleted, nil
}
