package server

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/fenced-dev/fenced/internal/plainhttp"
)

// writeAnswer writes a looped request's answer. The service's usual answer (a body, a status
// that allows one, plain header values) is written here byte for byte as http.Response.Write
// writes it, without the transfer writer and readers that function allocates per answer; any
// other answer is left to http.Response.Write. TestWriteAnswerAsNetHTTP compares the two.
func writeAnswer(bw *bufio.Writer, r *http.Request, status int, h http.Header, body []byte, closing bool) error {
	text := http.StatusText(status)
	if !plainAnswer(r, status, h, body) || text == "" {
		resp := &http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: 1, Header: h, Request: r,
			ContentLength: int64(len(body)), Body: http.NoBody, Close: closing}
		if len(body) > 0 {
			resp.Body = io.NopCloser(bytes.NewReader(body))
		}
		return resp.Write(bw)
	}
	var buf [16]string
	keys := buf[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys) // as http.Header.Write
	_, _ = bw.WriteString("HTTP/1.1 ")
	writeInt(bw, status)
	_ = bw.WriteByte(' ')
	_, _ = bw.WriteString(text)
	_, _ = bw.WriteString("\r\n")
	if closing {
		_, _ = bw.WriteString("Connection: close\r\n")
	}
	_, _ = bw.WriteString("Content-Length: ")
	writeInt(bw, len(body))
	_, _ = bw.WriteString("\r\n")
	for _, k := range keys {
		for _, v := range h[k] {
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			_, _ = bw.WriteString(v)
			_, _ = bw.WriteString("\r\n")
		}
	}
	_, _ = bw.WriteString("\r\n")
	_, err := bw.Write(body)
	return err
}

// writeInt writes n, not negative, in decimal (bufio.Writer.Write would move a buffer for
// strconv.AppendInt to the heap).
func writeInt(bw *bufio.Writer, n int) {
	div := 1
	for div*10 <= n {
		div *= 10
	}
	for ; div > 0; div /= 10 {
		_ = bw.WriteByte(byte('0' + n/div%10))
	}
}

// plainAnswer reports whether writeAnswer may write the answer itself: it has a body, its
// status allows one, the request is not HEAD, and no header is one http.Response.Write
// writes or changes itself (length, transfer coding, trailer, connection, a value with a line
// break or with white space at either end, a key outside the token characters).
func plainAnswer(r *http.Request, status int, h http.Header, body []byte) bool {
	if len(body) == 0 || status < 200 || status == http.StatusNoContent || status == http.StatusNotModified || status > 999 ||
		r.Method == http.MethodHead {
		return false
	}
	for k, vs := range h {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Length", "Transfer-Encoding", "Trailer", "Connection":
			return false
		}
		if k == "" || !plainhttp.TokenOnly(k) {
			return false
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n") || v != strings.Trim(v, " \t") {
				return false
			}
		}
	}
	return true
}
