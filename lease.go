package fenced

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/pointer"
	"github.com/fenced-dev/fenced/internal/trustclock"
)

const (
	opAcquire           = "acquire"
	opPublish           = "publish"
	opPublishAndRelease = "publish and release"
	opRenew             = "renew"
	opRelease           = "release"
)

var errReleased = errors.New("lease released")

// Token is a lease's fencing token. Tokens of one resource are ordered: epoch first, then
// generation. Every acquisition gets a token greater than every earlier one, also across an
// epoch bump after a restore that lost generations.
type Token struct {
	Epoch      int64
	Generation int64
}

// Compare returns -1, 0 or +1 as t is older than, equal to, or newer than u.
func (t Token) Compare(u Token) int {
	switch {
	case t.Epoch != u.Epoch:
		return cmpInt(t.Epoch, u.Epoch)
	default:
		return cmpInt(t.Generation, u.Generation)
	}
}

// String is the token as "EPOCH.GENERATION", the form ParseToken reads and the fenced command
// prints and accepts (--token).
func (t Token) String() string {
	var b [41]byte // two int64s and the dot, on the stack: the string is the one allocation
	return string(strconv.AppendInt(append(strconv.AppendInt(b[:0], t.Epoch, 10), '.'), t.Generation, 10))
}

// lease names the lease holding t in messages: "lease 2.1", or "generation 1" when the epoch
// is not known.
func (t Token) lease() string {
	if t.Epoch == 0 {
		return fmt.Sprintf("generation %d", t.Generation)
	}
	return "lease " + t.String()
}

// ParseToken reads a token written as "EPOCH.GENERATION" (for example "2.1"), as String writes
// it: two positive decimal integers without signs, spaces or leading zeros. It returns
// *InvalidError naming what is wrong.
func ParseToken(s string) (Token, error) {
	e, g, ok := strings.Cut(s, ".")
	if !ok {
		return Token{}, invalid("token", "%q has no dot; write EPOCH.GENERATION, for example 2.1", s)
	}
	epoch, err := parseTokenPart(e)
	if err != nil {
		return Token{}, invalid("token", "%q: the epoch %s", s, err)
	}
	gen, err := parseTokenPart(g)
	if err != nil {
		return Token{}, invalid("token", "%q: the generation %s", s, err)
	}
	return Token{Epoch: epoch, Generation: gen}, nil
}

// parseTokenPart reads one positive decimal integer, digits only, so that exactly one spelling
// of each token is accepted.
func parseTokenPart(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("is missing")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a positive integer", s)
		}
	}
	if s == "0" {
		return 0, fmt.Errorf("%q is not a positive integer", s)
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return v, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Lease is one acquisition of a resource: its owner identity and its token. Every method that
// writes carries both to the database, which refuses it unless they are still current. A Lease
// is safe for concurrent use by multiple goroutines.
//
// Besides the database's verdict, a lease acquired by this process keeps a local trust window:
// from the moment the acquire request was sent, ttl minus the safety margin, on a clock that
// keeps counting while the machine is suspended (CLOCK_BOOTTIME on Linux; Go's own timers stop
// then). Done closes when that window ends (within a second of resuming, when it ended during
// a suspend; Err reports it at once), a renewal is refused, or the lease is released, so that
// work done under the lease can stop before the database would let another owner in.
type Lease struct {
	ref   driver.LeaseRef
	store *Store

	mu         sync.Mutex
	leaseUntil time.Time     // database clock; informational
	trustEnd   time.Duration // on trustclock; zero for LeaseFor handles
	timer      *trustclock.Timer
	done       chan struct{}
	err        error
}

// newLease returns the lease; trustEnd is the end of its trust window on trustclock, zero for
// none.
func newLease(s *Store, ref driver.LeaseRef, leaseUntil time.Time, trustEnd time.Duration) *Lease {
	l := &Lease{ref: ref, store: s, leaseUntil: leaseUntil, trustEnd: trustEnd, done: make(chan struct{})}
	if trustEnd != 0 {
		l.mu.Lock() // the timer may fire before the assignment below
		l.timer = trustclock.AfterFunc(trustEnd, l.trustEnded)
		l.mu.Unlock()
	}
	return l
}

// Resource is the name of the leased resource.
func (l *Lease) Resource() string { return l.ref.Resource }

// Owner is the random identity of this acquisition.
func (l *Lease) Owner() string { return l.ref.Owner }

// Generation is the acquisition's generation: every acquisition of the resource gets a larger
// one. Within one epoch it alone orders tokens.
func (l *Lease) Generation() int64 { return l.ref.Generation }

// Epoch is the store's recovery epoch when the lease was acquired.
func (l *Lease) Epoch() int64 { return l.ref.Epoch }

// Token is the fencing token (epoch, generation) to hand to any destination that checks it.
func (l *Lease) Token() Token { return Token{Epoch: l.ref.Epoch, Generation: l.ref.Generation} }

// LeaseUntil is the expiry on the database's clock as of the last acquisition or renewal. It
// is for display; the database alone judges it.
func (l *Lease) LeaseUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseUntil
}

// TrustUntil is the end of the local trust window (zero for a LeaseFor handle), as a time on
// this machine's clock read now: a suspend since the window began has already brought it
// closer. It is worked out from the clocks at each call, so two calls may differ by the
// microseconds between their readings.
func (l *Lease) TrustUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.trustEnd == 0 {
		return time.Time{}
	}
	return time.Now().Add(l.trustEnd - trustclock.Now())
}

// Done is closed when this process should stop trusting the lease. See Err for why.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease is trusted; afterwards it says why it is not, and matches
// ErrLeaseLost unless the lease was released by its holder. It reads the clock itself, so it
// reports a window that ended during a suspend at once, before Done has closed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.windowEndedLocked()
	return l.err
}

func (l *Lease) trustEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(l.trustEndedErr())
}

func (l *Lease) trustEndedErr() error {
	return fmt.Errorf("%w: the trust window of lease %s ended", ErrLeaseLost, l.Token())
}

// windowEndedLocked ends the lease if its trust window is over by the clock, whether or not
// the timer has fired. Called with l.mu held.
func (l *Lease) windowEndedLocked() {
	if l.err == nil && l.timer != nil && trustclock.Now() >= l.trustEnd {
		l.endLocked(l.trustEndedErr())
	}
}

// end closes Done once, recording why.
func (l *Lease) end(why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(why)
}

func (l *Lease) endLocked(why error) {
	if l.err != nil {
		return
	}
	l.err = why
	if l.timer != nil {
		l.timer.Stop()
	}
	close(l.done)
}

// PublishOption adjusts one publication.
type PublishOption func(*driver.Publication)

// WithOpID names the publication with an operation id of the caller's, so that an unknown
// outcome can be resolved later with Store.Resolve. Without it a fresh id is generated and
// reported in *OutcomeUnknownError.
func WithOpID(id string) PublishOption { return func(p *driver.Publication) { p.OpID = id } }

// WithSourceVersion states the version of the source data the payload was built from. The
// database refuses a publication whose source version is older than the published one. This is
// separate from ownership order: the newest owner can still have read an old replica.
func WithSourceVersion(v int64) PublishOption {
	return func(p *driver.Publication) { p.SourceVersion = v }
}

// Publish stores payload as the resource's published result, only if this lease is still the
// current, unexpired acquisition, its generation has not published before, and the options'
// conditions hold. A refusal is *RefusedError (ErrRefused) and nothing changed; an error after
// which the publication may have happened is *OutcomeUnknownError. Publish always asks the
// database, even after Done has closed: the database's check is the fence.
func (l *Lease) Publish(ctx context.Context, payload []byte, opts ...PublishOption) error {
	return l.publish(ctx, opPublish, payload, opts, l.store.drv.Publish)
}

// PublishAndRelease publishes and frees the lease in one statement.
func (l *Lease) PublishAndRelease(ctx context.Context, payload []byte, opts ...PublishOption) error {
	err := l.publish(ctx, opPublishAndRelease, payload, opts, l.store.drv.PublishAndRelease)
	if err == nil {
		l.end(errReleased)
		l.store.waits.released(l.ref.Resource)
	}
	return err
}

func (l *Lease) publish(ctx context.Context, op string, payload []byte, opts []PublishOption,
	do func(context.Context, driver.LeaseRef, driver.Publication) (bool, error)) error {
	pub := driver.Publication{Payload: payload}
	for _, o := range opts {
		o(&pub)
	}
	if pub.OpID == "" {
		pub.OpID = newID()
	} else if err := validOpID(pub.OpID); err != nil {
		return err
	}
	if pub.SourceVersion < 0 {
		return invalid("source version", "%d is negative", pub.SourceVersion)
	}
	if max := l.store.cfg.MaxPayloadBytes; len(payload) > max {
		return invalid("payload", "it is %d bytes; the limit is %d", len(payload), max)
	}
	// Readers take a payload with the artifact prefix for a pointer; only a valid one may carry it.
	if pointer.Is(payload) {
		if _, err := pointer.Decode(payload); err != nil {
			return invalid("payload", "it starts with the reserved artifact pointer prefix but is not a valid pointer (%v); publish artifacts with destination/artifact", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s %q: not sent: %w", op, l.ref.Resource, err)
	}
	ok, err := do(ctx, l.ref, pub)
	if err != nil {
		return mutationError(op, l.ref.Resource, err, func(e *OutcomeUnknownError) { e.OpID = pub.OpID })
	}
	if !ok {
		return l.store.refusal(ctx, op, l.ref, &pub)
	}
	return nil
}

// Renew extends the lease to database-now + ttl, only if it is still current and unexpired: a
// late renewal never revives a lease. On success the local trust window restarts from the
// moment the request was sent, unless Done has already closed (a lost lease stays lost
// locally). A refusal closes Done.
func (l *Lease) Renew(ctx context.Context, ttl time.Duration) error {
	margin, err := l.store.margin(ttl)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("renew %q: not sent: %w", l.ref.Resource, err)
	}
	sent := trustclock.Now()
	until, ok, err := l.store.drv.Renew(ctx, l.ref, ttl)
	if err != nil {
		merr := mutationError(opRenew, l.ref.Resource, err, nil)
		if errors.Is(merr, ErrRefused) { // the database was restored or promoted: never valid again
			l.end(fmt.Errorf("%w: %w", ErrLeaseLost, merr))
		}
		return merr
	}
	if !ok {
		rerr := l.store.refusal(ctx, opRenew, l.ref, nil)
		l.end(fmt.Errorf("%w: %w", ErrLeaseLost, rerr))
		return rerr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaseUntil = until
	l.windowEndedLocked() // a window that ended before the answer stays ended, as if the timer had fired
	if l.err == nil && l.timer != nil {
		l.trustEnd = sent + ttl - margin
		l.timer.Reset(l.trustEnd)
	}
	return nil
}

// Release frees the lease if owner and token still match; otherwise it changes nothing and
// returns *RefusedError. Done closes either way.
func (l *Lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("release %q: not sent: %w", l.ref.Resource, err)
	}
	ok, err := l.store.drv.Release(ctx, l.ref)
	if err != nil {
		merr := mutationError(opRelease, l.ref.Resource, err, nil)
		if errors.Is(merr, ErrRefused) {
			l.end(errReleased)
		}
		return merr
	}
	l.end(errReleased)
	if !ok {
		return l.store.refusal(ctx, opRelease, l.ref, nil)
	}
	l.store.waits.released(l.ref.Resource)
	return nil
}

// mutationError classifies a driver error from a mutation: certainly not applied, or unknown.
func mutationError(op, resource string, err error, fill func(*OutcomeUnknownError)) error {
	var perm *driver.PermissionError
	what := op
	if resource != "" {
		what = fmt.Sprintf("%s %q", op, resource)
	}
	switch {
	case errors.Is(err, driver.ErrIncarnationChanged):
		return incarnationError(op, resource, err)
	case errors.Is(err, driver.ErrReadOnly):
		return fmt.Errorf("%s: %w", what, err)
	case errors.As(err, &perm): // its text names the operation and the role
		return err
	case errors.Is(err, driver.ErrNotApplied):
		return fmt.Errorf("%s failed, nothing changed: %w", what, err)
	}
	e := &OutcomeUnknownError{Op: op, Resource: resource, Err: err}
	if fill != nil {
		fill(e)
	}
	return e
}
