package server

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// writeAnswer writes every answer byte for byte as http.Response.Write does, those it writes
// itself and those it leaves to net/http alike.
func TestWriteAnswerAsNetHTTP(t *testing.T) {
	json := []byte(`{"resource":"r ü","token":"1.2"}`)
	cases := []struct {
		name   string
		method string
		status int
		header http.Header
		body   []byte
	}{
		{"lease", "POST", 200, http.Header{"Content-Type": {"application/json"}, "Date": {"Sat, 05 Dec 2026 14:00:00 GMT"}, "Fenced-Request-Id": {"abc"}}, json},
		{"problem", "POST", 409, http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"1"}, "Date": {"x"}, "Fenced-Request-Id": {"abc"}}, json},
		{"several values", "GET", 200, http.Header{"Vary": {"b", "a"}, "A": {"1"}, "Zz-Last": {"z"}}, json},
		{"not canonical", "GET", 200, http.Header{"x-lower": {"1"}}, json},
		{"no body", "PUT", 200, http.Header{"Date": {"x"}}, nil},
		{"no body get", "GET", 200, http.Header{"Date": {"x"}}, nil},
		{"no content", "DELETE", 204, http.Header{"Date": {"x"}}, nil},
		{"head", "HEAD", 200, http.Header{"Date": {"x"}}, json},
		{"unknown status", "GET", 599, http.Header{"Date": {"x"}}, json},
		{"value with spaces", "GET", 200, http.Header{"X-A": {" padded\t"}}, json},
		{"value with a line break", "GET", 200, http.Header{"X-A": {"a\r\nX-B: b"}}, json},
		{"own length", "GET", 200, http.Header{"Content-Length": {"3"}}, []byte("abc")},
		{"own connection", "GET", 200, http.Header{"Connection": {"keep-alive"}}, json},
		{"own connection close", "GET", 200, http.Header{"Connection": {"close"}}, json},
		{"odd key", "GET", 200, http.Header{"X A": {"1"}}, json},
	}
	for _, c := range cases {
		for _, closing := range []bool{false, true} {
			r, err := http.NewRequest(c.method, "http://x/", nil)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			resp := &http.Response{StatusCode: c.status, ProtoMajor: 1, ProtoMinor: 1, Header: c.header.Clone(), Request: r,
				ContentLength: int64(len(c.body)), Body: io.NopCloser(bytes.NewReader(c.body)), Close: closing}
			if err := resp.Write(&want); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			bw := bufio.NewWriter(&got)
			if err := writeAnswer(bw, r, c.status, c.header.Clone(), c.body, closing); err != nil {
				t.Fatal(err)
			}
			if err := bw.Flush(); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("%s, close %v:\n got %q\nwant %q", c.name, closing, got.String(), want.String())
			}
		}
	}
}

// The usual answer is written without allocating.
func TestWriteAnswerAllocs(t *testing.T) {
	r, err := http.NewRequest("POST", "http://x/", nil)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"application/json"}, "Date": {"x"}, "Fenced-Request-Id": {"abc"}}
	body := []byte(`{"ok":true}`)
	bw := bufio.NewWriter(io.Discard)
	if n := testing.AllocsPerRun(100, func() { _ = writeAnswer(bw, r, 200, h, body, false) }); n != 0 {
		t.Fatalf("%v allocations per answer, want 0", n)
	}
}
