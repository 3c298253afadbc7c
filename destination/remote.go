package destination

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/fenced-dev/fenced"
)

// Remote fences a participating service over HTTP: Fence sends POST URL with the
// Fencing-Token header, which the service answers with 2xx once it has raised its mark (the
// gate package's FenceHandler does this). 409 is a stale token (*StaleError, with the
// service's current mark if its problem body names it), 422 an unknown resource, 400 a
// malformed token; any other answer is an error. A Remote is safe for concurrent use.
type Remote struct {
	URL    string
	Client *http.Client // default http.DefaultClient
}

// Fence implements fenced.Fencer.
func (f *Remote) Fence(ctx context.Context, resource string, token fenced.Token) error {
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
		return nil
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
