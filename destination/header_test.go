package destination_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, c := range []struct {
		resource string
		token    fenced.Token
		want     string
	}{
		{"report", fenced.Token{Epoch: 3, Generation: 41}, "report; 3.41"},
		{"nightly report; v2", fenced.Token{Epoch: 1796132345000000, Generation: 3}, "nightly%20report%3B%20v2; 1796132345000000.3"},
		{"Ünïcode 報告 100%", fenced.Token{Epoch: 7, Generation: 1}, "%C3%9Cn%C3%AFcode%20%E5%A0%B1%E5%91%8A%20100%25; 7.1"},
		{"a.b-c_d~e", fenced.Token{Epoch: 1, Generation: 9223372036854775807}, "a.b-c_d~e; 1.9223372036854775807"},
	} {
		got := destination.FormatHeader(c.resource, c.token)
		if got != c.want {
			t.Errorf("FormatHeader(%q, %s) = %q, want %q", c.resource, c.token, got, c.want)
		}
		r, tok, err := destination.ParseHeader(got)
		if err != nil || r != c.resource || tok != c.token {
			t.Errorf("ParseHeader(%q) = %q, %s, %v", got, r, tok, err)
		}
	}
	// Lower-case escapes and a tab after the ";" are accepted.
	if r, tok, err := destination.ParseHeader("a%3bb;\t2.5"); err != nil || r != "a;b" || tok != (fenced.Token{Epoch: 2, Generation: 5}) {
		t.Errorf("lower-case escape: %q %s %v", r, tok, err)
	}
}

func TestHeaderMalformed(t *testing.T) {
	for _, v := range []string{
		"", "report", "report 3.4", "; 3.4", "report; ", "report; 3", "report; 3.", "report; .4",
		"report; -1.4", "report; 3.-4", "report; +3.4", "report; 03.4", "report; 3.04",
		"report; 9223372036854775808.1", "report; 1.9223372036854775808",
		"report; 99999999999999999999999.1", "report; 3.4.5", "report; 3,4", "report; 3.4 ",
		"report; 0x3.4", "report; 0.4", "report; 3.0", "two words; 3.4", "a;b; 3.4", "%zz; 3.4", "%4; 3.4", "a%; 3.4",
		"%00; 3.4", "%FF; 3.4", "%0A; 3.4", strings.Repeat("a", 256) + "; 3.4",
	} {
		r, tok, err := destination.ParseHeader(v)
		var he *destination.HeaderError
		if !errors.As(err, &he) || !errors.Is(err, destination.ErrMalformed) {
			t.Errorf("ParseHeader(%q) = %q, %s, %v; want a *HeaderError", v, r, tok, err)
			continue
		}
		if he.Reason == "" {
			t.Errorf("ParseHeader(%q): no reason", v)
		}
	}
}

func TestFromRequest(t *testing.T) {
	r := httptest.NewRequest("PUT", "/", nil)
	if _, _, err := destination.FromRequest(r); !errors.Is(err, destination.ErrMalformed) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing header: %v", err)
	}
	r.Header.Add(destination.Header, "a; 1.2")
	r.Header.Add(destination.Header, "a; 1.3")
	if _, _, err := destination.FromRequest(r); !errors.Is(err, destination.ErrMalformed) {
		t.Errorf("two headers: %v", err)
	}
}

type holder struct {
	resource string
	token    fenced.Token
}

func (h holder) Resource() string    { return h.resource }
func (h holder) Token() fenced.Token { return h.token }

func TestTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, tok, err := destination.FromRequest(r)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		_, _ = io.WriteString(w, res+"|"+tok.String())
	}))
	defer srv.Close()
	h := holder{"q; ü", fenced.Token{Epoch: 1796132345000000, Generation: 3}}
	c := &http.Client{Transport: &destination.Transport{Holder: h}}
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set(destination.Header, "old; 1.1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(body) != "q; ü|1796132345000000.3" {
		t.Errorf("server saw %q", body)
	}
	if req.Header.Get(destination.Header) != "old; 1.1" {
		t.Errorf("the caller's request was modified")
	}
}

// FuzzParseHeader: the parser never panics, and whatever it accepts formats back to a value
// that parses to the same resource and token; every valid resource and token round-trips.
func FuzzParseHeader(f *testing.F) {
	for _, s := range []string{"report; 3.41", "nightly%20report%3B; 1796132345000000.3", "%C3%9C; 0.0",
		"a; -1.2", "a; 9223372036854775807.9223372036854775807", "a;3.4", "%; 1.1"} {
		f.Add(s, "r é;%", int64(1796132345000000), int64(3))
		f.Add(s, "x", int64(0), int64(1))
	}
	f.Fuzz(func(t *testing.T, v, resource string, epoch, gen int64) {
		if r, tok, err := destination.ParseHeader(v); err == nil {
			r2, tok2, err := destination.ParseHeader(destination.FormatHeader(r, tok))
			if err != nil || r2 != r || tok2 != tok {
				t.Fatalf("%q parsed to %q %s, which re-parsed to %q %s %v", v, r, tok, r2, tok2, err)
			}
		}
		if epoch <= 0 || gen <= 0 || fenced.ValidateResource(resource) != nil {
			return
		}
		want := fenced.Token{Epoch: epoch, Generation: gen}
		r, tok, err := destination.ParseHeader(destination.FormatHeader(resource, want))
		if err != nil || r != resource || tok != want {
			t.Fatalf("%q %s did not round-trip: %q %s %v", resource, want, r, tok, err)
		}
	})
}
