package destination

import (
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced"
)

// ErrStale matches every *StaleError: the destination holds a newer token than the one
// presented, so the write or the fence was refused and nothing changed.
var ErrStale = errors.New("stale fencing token")

// ErrUnknownResource means the destination does not know the resource (a gate without a mark
// for it): nothing was changed. It is a configuration error, not a fence.
var ErrUnknownResource = errors.New("unknown resource")

// CheckToken returns an error matching ErrMalformed unless token is one a lease store could
// have issued: epoch and generation both at least 1, as fenced.ParseToken reads them. A
// destination calls it before sending anything, so that the zero Token or a negative part is
// refused as malformed rather than compared with the stored token, and is never recorded
// where a later reading would fail on it.
func CheckToken(token fenced.Token) error {
	if token.Epoch < 1 || token.Generation < 1 {
		return fmt.Errorf("token %s is not a lease's token (its epoch and generation start at 1): %w", token, ErrMalformed)
	}
	return nil
}

// StaleError is a refusal by the destination: Current is newer than Token. Current was read
// after the refusal and is advisory (zero if it could not be read). A StaleError is a value:
// safe to share once returned.
type StaleError struct {
	Resource string
	Token    fenced.Token // the token presented
	Current  fenced.Token // the destination's token when it refused
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("%q: token %s is older than the destination's %s", e.Resource, e.Token, e.Current)
}

func (e *StaleError) Is(target error) bool { return target == ErrStale }
