package destination

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/fenced-dev/fenced"
)

// Header is the HTTP header that carries a fencing token:
//
//	Fencing-Token: <resource>; <epoch>.<generation>
//
// <resource> is the resource name percent-encoded: every byte of its UTF-8 form other than
// ASCII letters, digits and "-._~" is written as %XX, so that names with spaces, ";", "%" or
// non-ASCII letters travel unchanged ("nightly report" is "nightly%20report"). The token is
// written as fenced.ParseToken reads it: positive decimal integers that fit in an int64, without
// sign or leading zeros; epochs are large (microseconds since 1970, from the backend's clock). Optional spaces or tabs may follow the ";". One header, one token: a request carrying
// several Fencing-Token values is malformed.
const Header = "Fencing-Token"

// MarkHeader is how a fenced gate confirms a fence (destination/gate's FenceHandler): its
// answer carries the resource and the mark now stored, in Header's syntax,
//
//	Fencing-Mark: <resource>; <epoch>.<generation>
//
// Remote requires it, so that a server answering 2xx to any POST (a catch-all route, a proxy's
// error page) is not taken for a fence.
const MarkHeader = "Fencing-Mark"

// ErrMalformed matches every *HeaderError and CheckToken's errors.
var ErrMalformed = errors.New("malformed fencing token")

// HeaderError says what is wrong with a Fencing-Token value. It matches ErrMalformed.
type HeaderError struct {
	Value  string // the value as received, truncated to 200 bytes
	Reason string
}

func (e *HeaderError) Error() string {
	return fmt.Sprintf("%s header %q: %s", Header, e.Value, e.Reason)
}

func (e *HeaderError) Is(target error) bool { return target == ErrMalformed }

// FormatHeader returns the Fencing-Token value for resource and token.
func FormatHeader(resource string, token fenced.Token) string {
	return escape(resource) + "; " + token.String()
}

// ParseHeader parses one Fencing-Token value. The error is *HeaderError.
func ParseHeader(v string) (resource string, token fenced.Token, err error) {
	bad := func(format string, args ...any) (string, fenced.Token, error) {
		shown := v
		if len(shown) > 200 {
			shown = shown[:200]
		}
		return "", fenced.Token{}, &HeaderError{Value: shown, Reason: fmt.Sprintf(format, args...)}
	}
	enc, tok, ok := strings.Cut(v, ";")
	if !ok {
		return bad(`want "<resource>; <epoch>.<generation>"`)
	}
	if enc == "" {
		return bad("the resource is empty")
	}
	resource, err = unescape(enc)
	if err != nil {
		return bad("the resource: %v", err)
	}
	var inv *fenced.InvalidError
	if errors.As(fenced.ValidateResource(resource), &inv) {
		return bad("the resource: %s", inv.Reason)
	}
	tok = strings.TrimLeft(tok, " \t")
	if token, err = fenced.ParseToken(tok); err != nil {
		var inv *fenced.InvalidError
		if errors.As(err, &inv) {
			return bad("%s", inv.Reason)
		}
		return bad("%v", err)
	}
	return resource, token, nil
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func escape(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// unescape is strict: only unreserved bytes and %XX escapes, so that one name has one form
// apart from the case of the hex digits.
func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case unreserved(c):
			b.WriteByte(c)
		case c == '%':
			if i+2 >= len(s) {
				return "", errors.New("a % is not followed by two hex digits")
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("%q is not a percent escape", s[i:i+3])
			}
			b.WriteByte(hi<<4 | lo)
			i += 2
		default:
			return "", fmt.Errorf("the byte %q must be percent-encoded", c)
		}
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// FromRequest reads the token of a request. A missing header, several headers, or a malformed
// value are *HeaderError.
func FromRequest(r *http.Request) (resource string, token fenced.Token, err error) {
	vs := r.Header.Values(Header)
	switch len(vs) {
	case 0:
		return "", fenced.Token{}, &HeaderError{Reason: "the header is missing"}
	case 1:
		return ParseHeader(vs[0])
	}
	return "", fenced.Token{}, &HeaderError{Value: strings.Join(vs, ", "), Reason: fmt.Sprintf("%d values; send one", len(vs))}
}

// Holder is what carries a token: *fenced.Lease is one.
type Holder interface {
	Resource() string
	Token() fenced.Token
}

// SetHeader sets the holder's Fencing-Token on h, replacing any earlier value.
func SetHeader(h http.Header, l Holder) { h.Set(Header, FormatHeader(l.Resource(), l.Token())) }

// Transport is an http.RoundTripper that sends the holder's token with every request. It is
// safe for concurrent use if Base is.
type Transport struct {
	Holder Holder
	Base   http.RoundTripper // default http.DefaultTransport
}

// RoundTrip sends a copy of req carrying the Fencing-Token header; req itself is not modified,
// as the RoundTripper contract requires.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	r := req.Clone(req.Context())
	SetHeader(r.Header, t.Holder)
	return base.RoundTrip(r)
}
