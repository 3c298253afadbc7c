package server

import (
	_ "embed"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
)

// The dashboard shows the resources this service has answered for since it started (the
// driver interface has no listing), each read afresh from the database, and the latest
// refusals it answered with their cause.

//go:embed dashboard.html
var dashboardHTML []byte

const (
	maxSeen     = 500 // resources remembered for the dashboard
	maxRefusals = 50  // refusals remembered
)

// Refusal is one refused lease operation as the dashboard lists it.
type Refusal struct {
	At           time.Time `json:"at"` // the service's clock: when it answered
	Resource     string    `json:"resource"`
	Operation    string    `json:"operation"`
	Cause        string    `json:"cause"`
	CurrentToken string    `json:"current_token,omitempty"`
}

// Dashboard is GET /v1/dashboard.
type Dashboard struct {
	Resources []State   `json:"resources"`
	Refusals  []Refusal `json:"refusals"`
	// Unreadable counts resources whose row could not be read just now.
	Unreadable int `json:"unreadable"`
}

// recent remembers resource names (most recent last) and refusals (newest first).
type recent struct {
	mu       sync.Mutex
	seen     []string
	refusals []Refusal
}

func (c *recent) saw(resource string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.seen, resource); i >= 0 {
		c.seen = slices.Delete(c.seen, i, i+1)
	}
	c.seen = append(c.seen, resource)
	if len(c.seen) > maxSeen {
		c.seen = slices.Delete(c.seen, 0, len(c.seen)-maxSeen)
	}
}

func (c *recent) refused(r Refusal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refusals = append([]Refusal{r}, c.refusals...)
	if len(c.refusals) > maxRefusals {
		c.refusals = c.refusals[:maxRefusals]
	}
}

// remember is called after each answer on a resource route.
func (c *recent) remember(op, resource string, rec *recorder) {
	if resource == "" || fenced.ValidateResource(resource) != nil {
		return
	}
	switch {
	case rec.prob == nil && rec.status < 300:
		c.saw(resource)
	case rec.prob != nil && (rec.prob.Type == TypeRefused || rec.prob.Type == TypeNotProvisioned && rec.prob.Cause != ""):
		c.saw(resource)
		c.refused(Refusal{At: time.Now().UTC(), Resource: resource, Operation: op, Cause: rec.prob.Cause, CurrentToken: rec.prob.CurrentToken})
	case rec.prob != nil && rec.prob.Type == TypeBusy:
		c.saw(resource)
	}
}

func (s *Server) dashboardPage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'")
	_, _ = w.Write(dashboardHTML)
}

// dashboard reads every remembered resource the caller may see, newest first.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	p := principalOf(w)
	s.recent.mu.Lock()
	names := slices.Clone(s.recent.seen)
	refusals := slices.Clone(s.recent.refusals)
	s.recent.mu.Unlock()
	out := Dashboard{Resources: []State{}, Refusals: []Refusal{}}
	for i := len(names) - 1; i >= 0; i-- {
		if !p.covers(names[i]) {
			continue
		}
		st, err := s.store.Show(r.Context(), names[i])
		if err != nil {
			out.Unreadable++
			continue
		}
		out.Resources = append(out.Resources, stateJSON(st, names[i]))
	}
	for _, ref := range refusals {
		if p.covers(ref.Resource) {
			out.Refusals = append(out.Refusals, ref)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
