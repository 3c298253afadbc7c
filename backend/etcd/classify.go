package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/fenced-dev/fenced/driver"
)

// Telling "not applied" from "unknown".
//
// gRPC reports a request that never reached a connection (no server could be dialled, the
// context ended while waiting for one) with the same codes as one whose connection broke while
// the server was working on it: Unavailable, DeadlineExceeded, Canceled. So the status code
// alone cannot prove a mutation did not happen. A gRPC stats handler can: grpc-go calls it
// with stats.Begin when a call starts and with stats.OutHeader only once the call's HEADERS
// frame has been queued on a connection (internal/transport http2_client.go, NewStream). A
// call that began and never reached OutHeader was never handed to a connection, and the
// server cannot act on a request whose headers it never received. Queued is not written, so
// the test errs on the side of "unknown".
//
// The handler works only when the client was built with DialOptions(); Open does that. Without
// it no call is seen to begin, and every transport failure stays an unknown outcome.
//
// Resends: clientv3's retry interceptor (client/v3 retry_interceptor.go, isSafeRetry) retries
// a Txn, which it treats as a non-repeatable mutation (the default nonRepeatable policy; only
// reads ask for withRepeatablePolicy), only when isSafeRetryMutableRPC (retry.go) holds:
// status Unavailable with the description "there is no address available" or "there is no
// connection available", that is, when the request was never sent. A Txn whose reply was lost
// is never resent behind the driver's back, with one caveat found in the same interceptor
// (unaryClientInterceptor): a call that fails with a context error (codes DeadlineExceeded or
// Canceled) while the caller's context is still live is retried whatever its policy. With the
// driver's calls that cannot happen, since the call's context is the caller's; it would if a
// client interceptor gave each call a shorter deadline of its own (do not install one), and
// it would if a server answered a live call with such a status, which the driver cannot rule
// out from the client side.

// DialOptions returns the gRPC dial options the driver needs on a client passed to New, to
// tell a request that never left the client from one whose reply was lost; add them to
// clientv3.Config.DialOptions. Open uses them.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStatsHandler(sendWatcher{})}
}

// sent records what the stats handler saw of one call (and of clientv3's retries of it, which
// share the context).
type sent struct{ begun, queued atomic.Bool }

type sentKey struct{}

// sendWatcher is the stats handler; it keeps no state of its own.
type sendWatcher struct{}

func (sendWatcher) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (sendWatcher) HandleRPC(ctx context.Context, s stats.RPCStats) {
	w, _ := ctx.Value(sentKey{}).(*sent)
	if w == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		w.begun.Store(true)
	case *stats.OutHeader, *stats.OutPayload:
		w.queued.Store(true)
	}
}

func (sendWatcher) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (sendWatcher) HandleConn(context.Context, stats.ConnStats)                       {}

// txn runs one Txn and classifies its error in one place. A context already done is reported
// before anything is sent.
func (d *Driver) txn(ctx context.Context, what string, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s txn: %w", what, driver.NotApplied(err))
	}
	w := &sent{}
	resp, err := d.cli.Txn(context.WithValue(ctx, sentKey{}, w)).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		err = classify(err, w)
		if errors.Is(err, driver.ErrNotApplied) && status.Code(err) == codes.Unavailable {
			return nil, driver.NotApplied(d.connectionFailure(err)) // which Txn is beside the point
		}
		return nil, fmt.Errorf("%s txn: %w", what, err)
	}
	return resp, nil
}

// failFast makes a call that finds no connection ready (every endpoint refused or failed its
// last dial) fail at once with Unavailable, instead of clientv3's default of waiting for one
// until the call's context ends, which for a caller without a deadline (the CLI) is forever.
// Such a call was never handed to a connection: classify reports it not applied, as it would
// the same call abandoned by its context. A call made while a connection is being dialled
// still waits for that dial's outcome. Authentication is left to wait as before: Open
// authenticates within clientv3.Config.DialTimeout and diagnose explains a timeout there.
func failFast(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasPrefix(method, "/etcdserverpb.Auth/") {
		opts = append(opts, grpc.WaitForReady(false)) // after clientv3's own WaitForReady(true)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// connError is a failure to connect, in the user's terms; the gRPC error stays reachable with
// errors.As.
type connError struct {
	msg string
	err error
}

func (e *connError) Error() string { return e.msg }
func (e *connError) Unwrap() error { return e.err }

// connectionFailure words an Unavailable error of a call that never reached a connection as
// one sentence naming the endpoints and the last dial's cause. gRPC reports that cause as text
// only, ending with the dialer's own error ("... dial tcp 127.0.0.1:1: connect: connection
// refused"), whose last part is the cause.
func (d *Driver) connectionFailure(err error) error {
	msg := status.Convert(err).Message()
	cause := strings.TrimRight(msg[strings.LastIndex(msg, ": ")+1:], `"`)
	cause = strings.TrimSpace(cause)
	eps := d.cli.Endpoints()
	where := "the etcd server at " + strings.Join(eps, ", ")
	if len(eps) > 1 {
		where = "any of the etcd servers at " + strings.Join(eps, ", ")
	}
	return &connError{msg: fmt.Sprintf("cannot connect to %s: %s", where, cause), err: err}
}

// classify marks the errors after which a Txn certainly did not take effect: it was never
// handed to a connection (see above), or etcd rejected it before applying it. Every code below
// is a rejection of the request as a whole (etcd checks a Txn's keys, leases, size, quota and
// permissions before it applies any of it): request too large and too many ops
// (InvalidArgument), a lease that no longer exists (NotFound), the space quota or too many
// requests (ResourceExhausted), auth (PermissionDenied, Unauthenticated, FailedPrecondition),
// a compacted revision (OutOfRange). A ResourceExhausted raised by the client for a reply too
// large to receive comes after the server acted, and is not one of them. Unavailable (timeouts,
// leader changes, a broken connection), DeadlineExceeded, Canceled and everything else may
// come after etcd committed the Txn, and stay unknown.
func classify(err error, w *sent) error {
	if w != nil && w.begun.Load() && !w.queued.Load() {
		return driver.NotApplied(err)
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.OutOfRange,
		codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return driver.NotApplied(err)
	case codes.ResourceExhausted:
		if !strings.Contains(err.Error(), "received message larger than max") {
			return driver.NotApplied(err)
		}
	}
	return err
}
