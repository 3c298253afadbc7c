package server

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/fenced-dev/fenced/internal/plainhttp"
)

// readPlainRequest reads a looped connection's next request when it has the service's usual
// shape and its whole header is already buffered in br: an HTTP/1.1 request line with a path,
// header lines of token names and printable values, at most one Content-Length and no header
// that http.ReadRequest treats specially (Connection, Transfer-Encoding, Trailer, Pragma, a
// second Host). It returns the request as http.ReadRequest would, with fewer allocations, and
// true; for anything else it consumes nothing and returns false, and the caller uses
// http.ReadRequest on the same reader. It accepts only what http.ReadRequest accepts
// (TestReadPlainRequestAsNetHTTP, FuzzReadPlainRequest), never a header longer than limit,
// and never waits for input.
func readPlainRequest(br *bufio.Reader, limit int) (*http.Request, bool) {
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 || end+4 > limit {
		return nil, false
	}
	head := buf[:end+2] // every line with its CRLF
	nl := bytes.IndexByte(head, '\n')
	if nl < 1 || head[nl-1] != '\r' {
		return nil, false
	}
	line := head[:nl-1]
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 || !upperOnly(line[:sp1]) {
		return nil, false
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 || rest[0] != '/' || string(rest[sp2+1:]) != "HTTP/1.1" || !visibleOnly(rest[:sp2]) {
		return nil, false
	}
	s := string(head) // the request's strings are parts of this one
	method, uri := s[:sp1], s[sp1+1:sp1+1+sp2]
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, false
	}
	h, ok := plainhttp.Header(s[nl+1:])
	if !ok {
		return nil, false
	}
	for _, k := range [...]string{"Connection", "Transfer-Encoding", "Trailer", "Pragma"} {
		if h[k] != nil {
			return nil, false
		}
	}
	host, length := h["Host"], h["Content-Length"]
	if len(host) != 1 || len(length) > 1 {
		return nil, false
	}
	contentLength := int64(0)
	if length != nil {
		if contentLength, ok = decimal(length[0]); !ok {
			return nil, false
		}
	}
	delete(h, "Host") // as http.ReadRequest
	r := &http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: http.NoBody, ContentLength: contentLength, Host: host[0], RequestURI: uri}
	if contentLength > 0 {
		r.Body = &plainBody{br: br, n: contentLength}
	}
	_, _ = br.Discard(end + 4)
	return r, true
}

// upperOnly reports whether b is not empty and holds only the letters A to Z.
func upperOnly(b []byte) bool {
	for _, c := range b {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return len(b) > 0
}

// visibleOnly reports whether b holds only visible ASCII characters other than '#'.
func visibleOnly(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// decimal parses a Content-Length of 1 to 18 digits.
func decimal(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// plainBody is a request body of a known length read from the connection, as net/http's: an
// early end of input is io.ErrUnexpectedEOF, the last bytes come with io.EOF, Close reads what
// is left and a read after Close is http.ErrBodyReadAfterClose.
type plainBody struct {
	mu     sync.Mutex
	br     *bufio.Reader
	n      int64 // bytes left
	sawEOF bool
	closed bool
}

func (b *plainBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.readLocked(p)
}

func (b *plainBody) readLocked(p []byte) (int, error) {
	if b.sawEOF || b.n <= 0 {
		b.sawEOF = true
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	switch {
	case err == io.EOF:
		b.sawEOF = true
		if b.n > 0 {
			err = io.ErrUnexpectedEOF
		}
	case err == nil && n > 0 && b.n == 0:
		err = io.EOF
		b.sawEOF = true
	}
	return n, err
}

func (b *plainBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	var err error
	if !b.sawEOF {
		_, err = io.Copy(io.Discard, readerFunc(b.readLocked))
	}
	b.closed = true
	return err
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
