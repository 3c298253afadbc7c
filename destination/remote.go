package destination

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/fenced-dev/fenced"
)

// Remote fences a participating service over HTTP: Fence sends POST URL with the
// Fencing-Token header, which the service answers with 2xx once it has raised its mark,
// confirmed by the Fencing-Mark header (MarkHeader) naming the resource and a mark at least
// the token sent (the gate package's FenceHandler does this). A 2xx without that confirmation
// is an error: a catch-all route or a proxy may answer 200 to any POST. 409 is a stale token (*StaleError, with the
// service's current mark if its problem body names it), 422 an unknown resource, 400 a
// malformed token; any other answer is an error. A Remote is safe for concurrent use.
type Remote struct {
	URL    string
	Client *http.Client // default http.DefaultClient
	// Timeout bounds each Fence, answer included; default none beyond ctx's. A holder fences
	// before its renewals start, so a service that never answers would otherwise hold it
	// while its lease runs out.
	Timeout time.Duration
}

var errFenceTimeout = errors.New("the fence timed out")

// Fence implements fenced.Fencer.
func (f *Remote) Fence(ctx context.Context, resource string, token fenced.Token) error {
	if f.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, f.Timeout, errFenceTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.URL, nil)
	if err != nil {
		return fmt.Errorf("the fence service URL %s: %w", f.URL, err)
	}
	req.Header.Set(Header, FormatHeader(resource, token))
	c := f.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		if context.Cause(ctx) == errFenceTimeout {
			return fmt.Errorf("the fence service at %s did not answer within %s: %w", f.URL, f.Timeout, context.DeadlineExceeded)
		}
		return fmt.Errorf("the fence service at %s: %w", f.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var p struct {
		Detail  string `json:"detail"`
		Current string `json:"current"`
	}
	_ = json.Unmarshal(body, &p)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return f.confirmed(resp.Header, resource, token)
	case resp.StatusCode == http.StatusConflict:
		e := &StaleError{Resource: resource, Token: token}
		if cur, err := fenced.ParseToken(p.Current); err == nil {
			e.Current = cur
		}
		return e
	case resp.StatusCode == http.StatusUnprocessableEntity:
		return fmt.Errorf("the fence service at %s: %q: %w", f.URL, resource, ErrUnknownResource)
	case resp.StatusCode == http.StatusBadRequest:
		return fmt.Errorf("the fence service at %s: %w: %s", f.URL, ErrMalformed, p.Detail)
	}
	return fmt.Errorf("the fence service at %s answered %s: %s", f.URL, resp.Status, bytes.TrimSpace(body))
}

// confirmed checks the Fencing-Mark header of a 2xx answer: one value, for resource, naming a
// mark not older than token.
func (f *Remote) confirmed(h http.Header, resource string, token fenced.Token) error {
	vs := h.Values(MarkHeader)
	if len(vs) == 0 {
		return fmt.Errorf("%s did not confirm the fence (no %s in its answer): is it a fenced gate?", f.URL, MarkHeader)
	}
	if len(vs) > 1 {
		return fmt.Errorf("%s did not confirm the fence (%d %s values in its answer, want one): is it a fenced gate?", f.URL, len(vs), MarkHeader)
	}
	r, mark, err := ParseHeader(vs[0])
	switch {
	case err != nil:
		return fmt.Errorf("%s did not confirm the fence (its %s %q does not parse): is it a fenced gate?", f.URL, MarkHeader, vs[0])
	case r != resource:
		return fmt.Errorf("%s confirmed a fence of %q, not of %q: is the URL the gate of this resource?", f.URL, r, resource)
	case mark.Compare(token) < 0:
		return fmt.Errorf("%s confirmed the mark %s for %q, older than the token %s it was sent: the fence did not take", f.URL, mark, resource, token)
	}
	return nil
}
