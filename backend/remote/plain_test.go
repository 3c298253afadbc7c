package remote

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/driver"
)

// The driver's own requests through a SyncTransport are written byte for byte as
// http.Request.Write writes them.
func TestSyncPlainRequestAsNetHTTP(t *testing.T) {
	publish := http.Header{"Content-Type": {"application/octet-stream"}, "Fenced-Owner": {"%C3%BC%20o"}, "Fenced-Token": {"2.7"}, "Fenced-Op-Id": {"op-1"}}
	for _, base := range []string{"http://127.0.0.1:4000", "http://127.0.0.1:4000/", "https://h.example:8443/svc/", "http://[::1]:9/a%20b", "http://localhost"} {
		for _, c := range []struct {
			method, path string
			header       http.Header
			body         []byte
		}{
			{"POST", "/v1/resources/r/acquire", http.Header{"Content-Type": {"application/json"}}, []byte(`{"owner":"o","ttl_ms":30000}`)},
			{"POST", "/v1/resources/" + escape("a/b ü") + "/publish-and-release", publish, []byte("payload")},
			{"POST", "/v1/resources/" + escape("..") + "/publish", publish, []byte{}},
			{"POST", "/v1/epoch/bump", http.Header{}, nil},
			{"PUT", "/v1/resources/r", http.Header{}, nil},
			{"GET", "/v1/info", http.Header{}, nil},
			{"GET", "/v1/resources/r", nil, []byte{}},
			{"GET", "/v1/resources/r", nil, []byte("x")},
		} {
			for _, token := range []string{"", "s3cr3t-token"} {
				d, err := Open(base, &Options{SyncTransport: true, BearerToken: token})
				if err != nil {
					t.Fatal(err)
				}
				p, ok := d.plainRequest(c.method, c.path, c.header, c.body)
				if !ok {
					t.Errorf("%s %s%s: not written by hand", c.method, base, c.path)
					continue
				}
				for _, sync := range []bool{false, true} {
					var rd io.Reader
					if c.body != nil {
						rd = bytes.NewReader(c.body)
					}
					req, err := http.NewRequest(c.method, d.prefix+c.path, rd)
					if err != nil {
						t.Fatal(err)
					}
					for k, v := range c.header {
						req.Header[k] = v
					}
					if token != "" {
						req.Header.Set("Authorization", "Bearer "+token)
					}
					if sync {
						req.Header.Set(headerSyncConnection, "sync")
					}
					var want, got bytes.Buffer
					if err := req.Write(&want); err != nil {
						t.Fatal(err)
					}
					bw := bufio.NewWriter(&got)
					writePlain(bw, &p, sync)
					_ = bw.Flush()
					if got.String() != want.String() {
						t.Errorf("%s %s%s, sync header %v:\n got %q\nwant %q", c.method, base, c.path, sync, got.String(), want.String())
					}
				}
			}
		}
	}
	// Requests net/http would write otherwise are left to it.
	d, _ := Open("http://h:1", &Options{SyncTransport: true, BearerToken: "a\r\nb"})
	if _, ok := d.plainRequest("GET", "/v1/info", nil, nil); ok {
		t.Error("a token with a line break is written by hand")
	}
	d, _ = Open("http://h:1", &Options{SyncTransport: true})
	for _, h := range []http.Header{{"X-A": {"1", "2"}}, {"X-A": {" 1"}}, {"x-a": {"1"}}, {"Host": {"y"}}, {"X-A": {"ü"}}} {
		if _, ok := d.plainRequest("GET", "/v1/info", h, nil); ok {
			t.Errorf("header %q is written by hand", h)
		}
	}
	if _, ok := d.plainRequest("DELETE", "/v1/info", nil, nil); ok {
		t.Error("DELETE is written by hand")
	}
	for _, base := range []string{"http://bücher.example", "http://[fe80::1%25eth0]:1"} {
		if d, err := Open(base, &Options{SyncTransport: true}); err == nil && d.plain {
			t.Errorf("%s: written by hand", base)
		}
	}
}

// answerCases are answers as the service writes them and variants of every kind readPlain
// leaves to http.ReadResponse.
var answerCases = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\nDate: Sat, 05 Dec 2026 14:00:00 GMT\r\n\r\n{}",
	"HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 3\r\nContent-Type: application/problem+json\r\nRetry-After: 1\r\n\r\nabc",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
	"HTTP/1.1 200 OK\r\ncontent-length:  3 \r\nx-a: 1\r\nX-A: 2\r\n\r\nabc",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
	"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
	"HTTP/1.1 204 No Content\r\nDate: x\r\n\r\n",
	"HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\n\r\nto the end",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
	"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: close\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 2000 OK\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\nContent-Length: 1\n\na",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX: a\rb\r\n\r\na",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX: a\r\n b\r\n\r\na",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX : a\r\n\r\na",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX: \xc3\xbc\r\n\r\na",
	"HTTP/1.1 200 O\x01K\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nContent-Le",
	"",
}

// readPlain reads every answer as http.ReadResponse and io.ReadAll read it.
func TestReadPlainAsNetHTTP(t *testing.T) {
	plain := 0
	for _, in := range answerCases {
		if diff, byHand := comparePlainAnswer(in); diff != "" {
			t.Errorf("%q: differs from net/http in the %s", in, diff)
		} else if byHand {
			plain++
		}
	}
	if plain != 7 {
		t.Errorf("%d answers read by hand, want 7", plain)
	}
}

// comparePlainAnswer reads in with readPlain and with net/http, and says how they differ
// ("" when in nothing) and whether readPlain read the header itself.
func comparePlainAnswer(in string) (diff string, byHand bool) {
	br := bufio.NewReader(strings.NewReader(in))
	_, _ = br.Peek(1)
	hbr := bufio.NewReader(strings.NewReader(in))
	_, _ = hbr.Peek(1)
	_, _, _, _, byHand = readPlainHead(hbr)
	a, closing, err := readPlain(br, http.MethodPost)
	sbr := bufio.NewReader(strings.NewReader(in))
	var want plainAnswer
	var wantClose bool
	resp, wantErr := http.ReadResponse(sbr, &http.Request{Method: http.MethodPost})
	if wantErr == nil {
		var body []byte
		body, wantErr = io.ReadAll(resp.Body)
		want, wantClose = plainAnswer{status: resp.StatusCode, header: resp.Header, body: body}, resp.Close
	}
	switch {
	case (err == nil) != (wantErr == nil) || err != nil && !errors.Is(err, wantErr) && err.Error() != wantErr.Error():
		return "error: " + errString(err) + " against " + errString(wantErr), byHand
	case err != nil:
		return "", byHand
	case a.status != want.status || closing != wantClose:
		return "status or close", byHand
	case !reflect.DeepEqual(a.header, want.header):
		return "header", byHand
	case !bytes.Equal(a.body, want.body):
		return "body", byHand
	}
	rest, _ := io.ReadAll(br)
	wantRest, _ := io.ReadAll(sbr)
	if !bytes.Equal(rest, wantRest) {
		return "what follows", byHand
	}
	return "", byHand
}

func errString(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

func FuzzReadPlain(f *testing.F) {
	for _, in := range answerCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if diff, _ := comparePlainAnswer(string(in)); diff != "" {
			t.Fatalf("differs from net/http in the %s", diff)
		}
	})
}

// TestTokenText: the token sent with every lease request reads as the service parses it, from
// one allocation.
func TestTokenText(t *testing.T) {
	for _, l := range []driver.LeaseRef{{Epoch: 2, Generation: 1}, {Epoch: 1 << 62, Generation: 1<<63 - 1}, {Epoch: 7, Generation: 1_000_000}} {
		if got, want := tokenText(l), fmt.Sprintf("%d.%d", l.Epoch, l.Generation); got != want {
			t.Errorf("tokenText(%+v) = %q, want %q", l, got, want)
		}
	}
	l := driver.LeaseRef{Epoch: 7, Generation: 1_000_000}
	if n := testing.AllocsPerRun(100, func() { _ = tokenText(l) }); n != 1 {
		t.Fatalf("tokenText: %v allocations, want 1", n)
	}
}
