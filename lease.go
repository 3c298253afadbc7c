package fenced

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

const (
	opPublish           = "publish"
	opPublishAndRelease = "publish and release"
	opRenew             = "renew"
	opRelease           = "release"
)

var errReleased = errors.New("lease released")

// Lease is one acquisition of a resource: its owner identity and generation (the fencing
// token). Every method that writes carries both to the database, which refuses it unless they
// are still current. A Lease is safe for concurrent use by multiple goroutines.
//
// Besides the database's verdict, a lease acquired by this process keeps a local trust window
// on the monotonic clock: from the moment the acquire request was sent, ttl minus the safety
// margin. Done closes when that window ends, a renewal is refused, or the lease is released,
// so that work done under the lease can stop before the database would let another owner in.
type Lease struct {
	ref   driver.LeaseRef
	store *Store

	mu         sync.Mutex
	leaseUntil time.Time // database clock; informational
	trustUntil time.Time // local monotonic clock; zero for LeaseFor handles
	timer      *time.Timer
	done       chan struct{}
	err        error
}

func newLease(s *Store, ref driver.LeaseRef, leaseUntil, trustUntil time.Time) *Lease {
	l := &Lease{ref: ref, store: s, leaseUntil: leaseUntil, trustUntil: trustUntil, done: make(chan struct{})}
	if !trustUntil.IsZero() {
		l.mu.Lock() // the timer may fire before the assignment below
		l.timer = time.AfterFunc(time.Until(trustUntil), l.trustEnded)
		l.mu.Unlock()
	}
	return l
}

// Resource is the name of the leased resource.
func (l *Lease) Resource() string { return l.ref.Resource }

// Owner is the random identity of this acquisition.
func (l *Lease) Owner() string { return l.ref.Owner }

// Generation is the fencing token: every acquisition of the resource gets a larger one.
func (l *Lease) Generation() int64 { return l.ref.Generation }

// LeaseUntil is the expiry on the database's clock as of the last acquisition or renewal. It
// is for display; the database alone judges it.
func (l *Lease) LeaseUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseUntil
}

// TrustUntil is the end of the local trust window (zero for a LeaseFor handle).
func (l *Lease) TrustUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trustUntil
}

// Done is closed when this process should stop trusting the lease. See Err for why.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease is trusted; afterwards it says why it is not, and matches
// ErrLeaseLost unless the lease was released by its holder.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lease) trustEnded() {
	l.end(fmt.Errorf("%w: the trust window of generation %d ended", ErrLeaseLost, l.ref.Generation))
}

// end closes Done once, recording why.
func (l *Lease) end(why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = why
	if l.timer != nil {
		l.timer.Stop()
	}
	close(l.done)
}

// Publish stores payload as the resource's published result, only if this lease is still the
// current, unexpired acquisition and its generation has not published before. A refusal is
// *RefusedError (ErrRefused) and nothing changed. Publish always asks the database, even after
// Done has closed: the database's check is the fence.
func (l *Lease) Publish(ctx context.Context, payload []byte) error {
	return l.publish(ctx, opPublish, payload, l.store.drv.Publish)
}

// PublishAndRelease publishes and frees the lease in one statement.
func (l *Lease) PublishAndRelease(ctx context.Context, payload []byte) error {
	err := l.publish(ctx, opPublishAndRelease, payload, l.store.drv.PublishAndRelease)
	if err == nil {
		l.end(errReleased)
	}
	return err
}

func (l *Lease) publish(ctx context.Context, op string, payload []byte,
	do func(context.Context, driver.LeaseRef, []byte) (bool, error)) error {
	if max := l.store.cfg.MaxPayloadBytes; len(payload) > max {
		return invalid("payload", "it is %d bytes; the limit is %d", len(payload), max)
	}
	ok, err := do(ctx, l.ref, payload)
	if err != nil {
		return fmt.Errorf("%s %q: %w", op, l.ref.Resource, err)
	}
	if !ok {
		return l.store.refusal(ctx, op, l.ref)
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
	sent := time.Now()
	until, ok, err := l.store.drv.Renew(ctx, l.ref, ttl)
	if err != nil {
		return fmt.Errorf("renew %q: %w", l.ref.Resource, err)
	}
	if !ok {
		rerr := l.store.refusal(ctx, opRenew, l.ref)
		l.end(fmt.Errorf("%w: %w", ErrLeaseLost, rerr))
		return rerr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaseUntil = until
	if l.err == nil && l.timer != nil {
		l.trustUntil = sent.Add(ttl - margin)
		l.timer.Reset(time.Until(l.trustUntil))
	}
	return nil
}

// Release frees the lease if owner and generation still match; otherwise it changes nothing
// and returns *RefusedError. Done closes either way.
func (l *Lease) Release(ctx context.Context) error {
	ok, err := l.store.drv.Release(ctx, l.ref)
	if err != nil {
		return fmt.Errorf("release %q: %w", l.ref.Resource, err)
	}
	l.end(errReleased)
	if !ok {
		return l.store.refusal(ctx, opRelease, l.ref)
	}
	return nil
}
