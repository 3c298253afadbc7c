package fenced

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultRunTTL is RunOptions.TTL when it is zero.
const DefaultRunTTL = 30 * time.Second

// RunOptions tunes Run. A nil *RunOptions means the defaults.
type RunOptions struct {
	// TTL is the lease's time to live. Default DefaultRunTTL.
	TTL time.Duration

	// Renew keeps renewing the lease while build runs, every RenewEvery. Without it, a build
	// that outlives the trust window loses its chance to publish.
	Renew bool

	// RenewEvery is the renewal interval. Default TTL/3. It must be shorter than the trust
	// window, or the lease would be lost between renewals.
	RenewEvery time.Duration

	// Fence lists destinations that check the token themselves. Right after acquiring, Run
	// installs the lease's token at each (Lease.Fence) before build starts, so they refuse the
	// previous holder's delayed writes from then on; if one cannot be fenced, build never runs
	// and the error matches ErrNotFenced. Default none.
	Fence []Fencer

	// Wait is how long to wait for a busy resource (Store.AcquireWait). Default 0: a busy
	// resource is returned as *BusyError at once.
	Wait time.Duration
}

// Result describes a publication that Run made.
type Result struct {
	Resource   string
	Owner      string
	Token      Token
	Generation int64 // Token.Generation
	Size       int
}

// BuildFunc computes the payload under a lease. ctx is cancelled, with cause ErrLeaseLost, as
// soon as the lease stops being trusted; a build should then stop. Anything it writes to other
// systems is not protected by the lease: only the payload it returns is fenced.
type BuildFunc func(ctx context.Context, lease *Lease) ([]byte, error)

// Run acquires resource, runs build under a context that dies with the lease, publishes what
// build returned and releases the lease.
//
// Acquisition and publication errors are returned: *BusyError when another owner holds the
// resource, *RefusedError when the database refused the publication (the output is discarded,
// never attached to a newer lease), ErrLeaseLost when the lease stopped being trusted before
// publishing. When the publication's reply is lost, Run resolves its operation id and reports
// the definite outcome; only if that fails too is *OutcomeUnknownError returned. An error from build is returned wrapped and nothing is published. The final
// release runs with its own timeout (Config.ReleaseTimeout) even when ctx is already
// cancelled; its failure is only logged, since the lease expires by itself.
func Run(ctx context.Context, s *Store, resource string, opts *RunOptions, build BuildFunc) (Result, error) {
	var o RunOptions
	if opts != nil {
		o = *opts
	}
	if o.TTL == 0 {
		o.TTL = DefaultRunTTL
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = o.TTL / 3
	}
	if o.RenewEvery < 0 {
		return Result{}, invalid("renew interval", "%s is negative", o.RenewEvery)
	}

	if o.Wait < 0 {
		return Result{}, invalid("wait", "%s is negative", o.Wait)
	}
	var lease *Lease
	var err error
	if o.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, o.Wait)
		lease, err = s.AcquireWait(wctx, resource, o.TTL)
		cancel()
	} else {
		lease, err = s.Acquire(ctx, resource, o.TTL)
	}
	if err != nil {
		return Result{}, err
	}
	if o.Renew {
		if margin, _ := s.margin(o.TTL); o.RenewEvery >= o.TTL-margin {
			s.release(ctx, lease)
			return Result{}, invalid("renew interval", "%s is not shorter than the trust window %s", o.RenewEvery, o.TTL-margin)
		}
	}
	ferr := fenceWhileTrusted(ctx, lease, o.Fence)
	// A slow fence, or a grant after a long wait, may have used up the trust window: build
	// must not start under a lease already lost.
	if lost := lease.Err(); lost != nil {
		s.release(ctx, lease)
		return Result{}, fmt.Errorf("run %q: the lease was lost before the build could start, so it did not run: %w", resource, lost)
	}
	if ferr != nil {
		s.release(ctx, lease)
		return Result{}, fmt.Errorf("run %q: %w", resource, ferr)
	}

	buildCtx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the build's context dies with the lease
		defer wg.Done()
		select {
		case <-lease.Done():
			cancel(lease.Err())
		case <-buildCtx.Done():
		}
	}()
	if o.Renew {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.renewLoop(buildCtx, lease, o.TTL, o.RenewEvery)
		}()
	}

	payload, buildErr := build(buildCtx, lease)
	lost := lease.Err() // read before cancel: the lease is still trusted or already lost
	cancel(nil)
	wg.Wait()

	switch {
	case lost != nil:
		s.release(ctx, lease)
		return Result{}, fmt.Errorf("run %q: %w", resource, lost)
	case buildErr != nil:
		s.release(ctx, lease)
		return Result{}, fmt.Errorf("run %q: build: %w", resource, buildErr)
	}
	res := Result{Resource: resource, Owner: lease.Owner(), Token: lease.Token(), Generation: lease.Generation(), Size: len(payload)}
	err = lease.PublishAndRelease(ctx, payload)
	var unknown *OutcomeUnknownError
	if errors.As(err, &unknown) {
		accepted, rerr := s.settle(ctx, unknown.OpID)
		switch {
		case rerr != nil:
			return Result{}, err // still unknown: the caller can resolve unknown.OpID later
		case accepted:
			return res, nil // the lost reply was a success, lease released with it
		default:
			err = fmt.Errorf("run %q: the publication's reply was lost and it was then resolved as not accepted: %w", resource, unknown.Err)
		}
	}
	if err != nil {
		// The statement did not release either; free the lease if it is still ours.
		s.release(ctx, lease)
		return Result{}, err
	}
	return res, nil
}

// fenceWhileTrusted fences dests under a context that ends when the lease stops being trusted.
func fenceWhileTrusted(ctx context.Context, lease *Lease, dests []Fencer) error {
	if len(dests) == 0 {
		return nil
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-lease.Done():
			cancel(lease.Err())
		case <-stop:
		}
	}()
	return lease.Fence(fctx, dests...)
}

// settle resolves a publication whose reply was lost, trying a few times within the release
// timeout; Resolve is idempotent, so repeating it after its own lost reply is safe.
func (s *Store) settle(ctx context.Context, opID string) (accepted bool, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReleaseTimeout)
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		var r Resolution
		if r, err = s.Resolve(rctx, opID); err == nil {
			return r.Accepted, nil
		}
	}
	s.cfg.Logger.Warn("fenced: could not resolve a publication whose reply was lost",
		"op_id", opID, "error", err)
	return false, err
}

// renewLoop renews every interval until ctx ends. A refusal ends the lease (and so the build's
// context); an operational error is logged and retried at the next tick, and if none succeeds
// the trust window ends by itself.
func (s *Store) renewLoop(ctx context.Context, lease *Lease, ttl, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := lease.Renew(ctx, ttl)
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.Is(err, ErrRefused):
			return
		default:
			s.cfg.Logger.Warn("fenced: renewal failed; retrying", "resource", lease.Resource(),
				"generation", lease.Generation(), "error", err)
		}
	}
}

// release frees the lease with its own bounded context and logs a failure.
func (s *Store) release(ctx context.Context, lease *Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReleaseTimeout)
	defer cancel()
	if err := lease.Release(rctx); err != nil && !errors.Is(err, ErrRefused) {
		s.cfg.Logger.Warn("fenced: release failed; the lease will expire by itself",
			"resource", lease.Resource(), "generation", lease.Generation(), "error", err)
	}
}
