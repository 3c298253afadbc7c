package server

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// plainRequestCases are requests as the remote driver sends them and variants of every kind
// readPlainRequest leaves to http.ReadRequest; plain says which it reads itself.
var plainRequestCases = []struct {
	name  string
	plain bool
	in    string
}{
	{"acquire", true, "POST /v1/resources/r1/acquire HTTP/1.1\r\nHost: 127.0.0.1:4000\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 35\r\nContent-Type: application/json\r\n\r\n{\"owner\":\"o\",\"ttl_ms\":30000.000001}"},
	{"publish", true, "POST /v1/resources/a%2Fb%20c/publish-and-release HTTP/1.1\r\nHost: x\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 5\r\nContent-Type: application/octet-stream\r\nFenced-Op-Id: 0f1e\r\nFenced-Owner: %C3%BC%20x\r\nFenced-Token: 1.2\r\n\r\nhello"},
	{"get, then the next request", true, "GET /v1/resources/r HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"query", true, "GET /v1/resources?prefix=a%20b&x HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"keys not canonical, repeated, padded", true, "POST /p HTTP/1.1\r\nhost: x\r\nx-a:1\r\nX-A:  2 \t\r\nfenced-op-id:\t3\r\nEmpty:\r\ncontent-length: 007\r\n\r\n1234567"},
	{"zero length", true, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"},
	{"expect", true, "POST /p HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab"},
	{"body cut short", true, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"},
	{"header cut short", false, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Le"},
	{"no host", false, "GET /p HTTP/1.1\r\n\r\n"},
	{"two hosts", false, "GET /p HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"},
	{"two lengths", false, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na"},
	{"two different lengths", false, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"},
	{"signed length", false, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\na"},
	{"empty length", false, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n"},
	{"huge length", false, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"},
	{"chunked", false, "POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"},
	{"connection close", false, "GET /p HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"},
	{"connection keep-alive", false, "GET /p HTTP/1.1\r\nHost: x\r\nconnection: keep-alive\r\n\r\n"},
	{"pragma", false, "GET /p HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\n\r\n"},
	{"trailer", false, "GET /p HTTP/1.1\r\nHost: x\r\nTrailer: X\r\n\r\n"},
	{"HTTP/1.0", false, "GET /p HTTP/1.0\r\nHost: x\r\n\r\n"},
	{"HTTP/2", false, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
	{"absolute URL", false, "GET http://y/p HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"connect", false, "CONNECT y:443 HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"lower-case method", false, "get /p HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"odd method", false, "M-SEARCH /p HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"two spaces", false, "GET  /p HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"space in path", false, "GET /p q HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"fragment", false, "GET /p#f HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"bad escape", false, "GET /p%zz HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"bare line feeds", false, "GET /p HTTP/1.1\nHost: x\n\n"},
	{"bare line feed in the header", false, "GET /p HTTP/1.1\r\nHost: x\nX: y\r\n\r\n"},
	{"carriage return in a value", false, "GET /p HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n"},
	{"folded line", false, "GET /p HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n"},
	{"space before the colon", false, "GET /p HTTP/1.1\r\nHost: x\r\nX : a\r\n\r\n"},
	{"empty key", false, "GET /p HTTP/1.1\r\nHost: x\r\n: a\r\n\r\n"},
	{"no colon", false, "GET /p HTTP/1.1\r\nHost: x\r\nX\r\n\r\n"},
	{"odd key", false, "GET /p HTTP/1.1\r\nHost: x\r\nX_Y: a\r\n\r\n"},
	{"control in a value", false, "GET /p HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n"},
	{"UTF-8 in a value", false, "GET /p HTTP/1.1\r\nHost: x\r\nX: \xc3\xbc\r\n\r\n"},
	{"empty line first", false, "\r\nGET /p HTTP/1.1\r\nHost: x\r\n\r\n"},
	{"nothing", false, "\r\n\r\n"},
}

// readBoth reads in with readPlainRequest, as the loop does (after a first byte has been
// waited for), and with http.ReadRequest.
func readBoth(in string, limit int) (plain *http.Request, ok bool, pbr *bufio.Reader, std *http.Request, sbr *bufio.Reader, stdErr error) {
	pbr = bufio.NewReader(strings.NewReader(in))
	_, _ = pbr.Peek(1)
	plain, ok = readPlainRequest(pbr, limit)
	sbr = bufio.NewReader(strings.NewReader(in))
	std, stdErr = http.ReadRequest(sbr)
	return
}

// samePlainRequest reports how the request readPlainRequest read differs from net/http's,
// their bodies and what follows them included ("" when in nothing).
func samePlainRequest(p *http.Request, pbr *bufio.Reader, s *http.Request, sbr *bufio.Reader) string {
	switch {
	case p.Method != s.Method || p.RequestURI != s.RequestURI || p.Proto != s.Proto || p.ProtoMajor != s.ProtoMajor || p.ProtoMinor != s.ProtoMinor:
		return "request line"
	case !reflect.DeepEqual(p.URL, s.URL):
		return "URL"
	case !reflect.DeepEqual(p.Header, s.Header):
		return "header"
	case p.Host != s.Host || p.ContentLength != s.ContentLength || p.Close != s.Close:
		return "host, length or close"
	case !reflect.DeepEqual(p.TransferEncoding, s.TransferEncoding) || !reflect.DeepEqual(p.Trailer, s.Trailer):
		return "transfer coding"
	case (p.Body == http.NoBody) != (s.Body == http.NoBody):
		return "no body"
	}
	// The body, read in small steps (each read's error compared), then closed twice and read.
	buf1, buf2 := make([]byte, 3), make([]byte, 3)
	for i := 0; i < 64; i++ {
		n1, err1 := p.Body.Read(buf1)
		n2, err2 := s.Body.Read(buf2)
		if n1 != n2 || string(buf1[:n1]) != string(buf2[:n2]) || !errors.Is(err1, err2) {
			return "body read"
		}
		if err1 != nil && i > 8 {
			break
		}
	}
	if e1, e2 := p.Body.Close(), s.Body.Close(); !errors.Is(e1, e2) {
		return "body close"
	}
	if e1, e2 := p.Body.Close(), s.Body.Close(); !errors.Is(e1, e2) {
		return "second close"
	}
	if _, e1 := p.Body.Read(buf1); true {
		if _, e2 := s.Body.Read(buf2); !errors.Is(e1, e2) {
			return "read after close"
		}
	}
	r1, _ := io.ReadAll(pbr)
	r2, _ := io.ReadAll(sbr)
	if string(r1) != string(r2) {
		return "what follows"
	}
	return ""
}

// readPlainRequest reads the usual requests as http.ReadRequest does, and leaves every other
// one, untouched, to it.
func TestReadPlainRequestAsNetHTTP(t *testing.T) {
	for _, c := range plainRequestCases {
		p, ok, pbr, s, sbr, err := readBoth(c.in, 1<<20)
		if ok != c.plain {
			t.Errorf("%s: read by hand %v, want %v", c.name, ok, c.plain)
		}
		if !ok {
			if pbr.Buffered() != len(c.in) {
				t.Errorf("%s: left to net/http after consuming %d bytes", c.name, len(c.in)-pbr.Buffered())
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: read by hand; net/http refuses it: %v", c.name, err)
			continue
		}
		if diff := samePlainRequest(p, pbr, s, sbr); diff != "" {
			t.Errorf("%s: differs from net/http in the %s", c.name, diff)
		}
	}
	// A header longer than the limit is left to net/http, which refuses it.
	in := plainRequestCases[0].in
	if _, ok, _, _, _, _ := readBoth(in, strings.Index(in, "\r\n\r\n")+3); ok {
		t.Error("a header past the limit was read by hand")
	}
	if _, ok, _, _, _, _ := readBoth(in, strings.Index(in, "\r\n\r\n")+4); !ok {
		t.Error("a header at the limit was not read by hand")
	}
}

// Whatever the input, readPlainRequest either leaves it untouched or reads what net/http
// reads.
func FuzzReadPlainRequest(f *testing.F) {
	for _, c := range plainRequestCases {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		p, ok, pbr, s, sbr, err := readBoth(string(in), 1<<20)
		if !ok {
			if pbr.Buffered() != min(len(in), 4096) {
				t.Fatal("left to net/http after consuming input")
			}
			return
		}
		if err != nil {
			t.Fatalf("read by hand; net/http refuses it: %v", err)
		}
		if diff := samePlainRequest(p, pbr, s, sbr); diff != "" {
			t.Fatalf("differs from net/http in the %s", diff)
		}
	})
}

// The usual request costs a handful of allocations.
func TestReadPlainRequestAllocs(t *testing.T) {
	in := plainRequestCases[1].in
	r := strings.NewReader(in)
	br := bufio.NewReader(r)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(in)
		br.Reset(r)
		_, _ = br.Peek(1)
		if _, ok := readPlainRequest(br, 1<<20); !ok {
			t.Fatal("not read by hand")
		}
	})
	if allocs > 9 { // http.ReadRequest: 18
		t.Errorf("%v allocations per request, want at most 9", allocs)
	}
}
