package fenced

import (
	"context"
	"errors"
	"fmt"
)

// Fencer is a destination that checks fencing tokens itself: a service's high-water-mark gate,
// a blob fenced by its store's own lease or conditional writes. Fence installs token as the
// resource's current token at the destination, so that from then on the destination refuses
// writes carrying an older token, whether or not the new holder has written anything yet. It
// returns an error matching destination.ErrStale when the destination already holds a newer
// token, and is idempotent for the token it already holds. Package destination has the
// implementations and their conformance suite.
type Fencer interface {
	Fence(ctx context.Context, resource string, token Token) error
}

// OwnerFencer is a Fencer that binds the fence to the acquisition itself, not only to its
// token: Lease.Fence (and so RunOptions.Fence) calls FenceOwner with the lease's owner instead
// of Fence. An Azure blob's lease ID derived from the owner is the example: the token is
// public (it sits in the blob's metadata), the owner is known only to the holder, so only the
// holder can present the lease ID, and an acquisition never shares it with another, even one
// that was issued the same token by a store rebuilt on a clock that went back.
type OwnerFencer interface {
	Fencer
	FenceOwner(ctx context.Context, resource, owner string, token Token) error
}

// Fence installs the lease's token at each destination, in order, right after acquisition and
// before the work starts. This narrows the gap a high-water mark leaves on its own: a new holder
// that has not written yet would otherwise leave its destinations accepting the previous
// holder's delayed writes. A delayed write that lands between the acquisition and the moment
// Fence returns is still accepted (README, the table of destinations). It stops at the first destination that cannot be fenced and returns
// its error; destinations fenced before it keep the new token, which is harmless since it is
// this lease's. Fence does not check the lease's trust window: a fence is only ever raised.
func (l *Lease) Fence(ctx context.Context, dests ...Fencer) error {
	for i, d := range dests {
		if d == nil {
			return invalid("destination", "destination %d is nil", i)
		}
		var err error
		if of, ok := d.(OwnerFencer); ok {
			err = of.FenceOwner(ctx, l.ref.Resource, l.ref.Owner, l.Token())
		} else {
			err = d.Fence(ctx, l.ref.Resource, l.Token())
		}
		if err != nil {
			return &FenceError{Resource: l.ref.Resource, Token: l.Token(), Index: i, Err: err}
		}
	}
	return nil
}

// ErrNotFenced matches every *FenceError.
var ErrNotFenced = errors.New("destination not fenced")

// FenceError says which destination could not be fenced with the lease's token. The work
// under the lease must not start. It matches ErrNotFenced and unwraps to the destination's
// error. A FenceError is a value: safe to share once returned.
type FenceError struct {
	Resource string
	Token    Token
	Index    int // position of the destination in the list given to Fence, from 0
	Err      error
}

// Error names the destination by its place in the list counting from 1, as a reader counts.
func (e *FenceError) Error() string {
	return fmt.Sprintf("fence %q with token %s at destination #%d: %v", e.Resource, e.Token, e.Index+1, e.Err)
}

func (e *FenceError) Unwrap() []error { return []error{ErrNotFenced, e.Err} }

// ValidateResource checks a resource name given from outside (an HTTP header, a command line)
// by the rules every Store applies. It returns *InvalidError.
func ValidateResource(r string) error { return validResource(r) }
