// Package plainhttp reads the header lines of HTTP/1.1 messages of the plain shape that the
// fenced service and its remote driver exchange, with fewer allocations than net/textproto.
// It accepts a strict subset of what net/textproto accepts and gives the same header for it;
// the callers leave anything else to net/http (server.readPlainRequest, the remote driver's
// readPlain), and their tests compare the two.
package plainhttp

import (
	"net/http"
	"strings"
)

// Header parses header lines, each ending in CRLF (the blank line that ends a header not
// included), as net/textproto.Reader.ReadMIMEHeader would: canonical keys, values without
// white space at either end, repeated keys in order. It reports false for any line that is
// not a key of letters, digits and '-', a colon, and a value of printable ASCII and tabs, and
// for no lines at all.
func Header(s string) (http.Header, bool) {
	lines := strings.Count(s, "\n")
	if lines < 1 || !strings.HasSuffix(s, "\r\n") {
		return nil, false
	}
	h := make(http.Header, lines)
	vals := make([]string, lines) // each key's first value; later ones are appended
	for i := 0; i < len(s); {
		j := i + strings.IndexByte(s[i:], '\n') // s ends with one
		if j == i || s[j-1] != '\r' {
			return nil, false
		}
		line := s[i : j-1]
		i = j + 1
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !TokenOnly(line[:colon]) {
			return nil, false
		}
		k := http.CanonicalHeaderKey(line[:colon])
		v := strings.Trim(line[colon+1:], " \t")
		if !Text(v) {
			return nil, false
		}
		if vv := h[k]; vv == nil {
			vv, vals = vals[:1:1], vals[1:]
			vv[0] = v
			h[k] = vv
		} else {
			h[k] = append(vv, v)
		}
	}
	return h, true
}

// TokenOnly reports whether s holds only letters, digits and '-'.
func TokenOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !Alnum(c) && c != '-' {
			return false
		}
	}
	return true
}

// Alnum reports whether c is an ASCII letter or digit.
func Alnum(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' }

// Text reports whether b holds only printable ASCII characters and tabs.
func Text[T string | []byte](b T) bool {
	for i := 0; i < len(b); i++ {
		if c := b[i]; (c < ' ' && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}
