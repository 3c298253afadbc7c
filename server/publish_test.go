package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/server"
)

// A publication whose body cannot be read (a malformed chunk) is the client's error: 400,
// not 503, and not a database error in the metrics; on net/http and on the loop.
func TestPublishUnreadableBody(t *testing.T) {
	const bad = "POST /v1/resources/r/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nFenced-Owner: o\r\nFenced-Token: 1.1\r\n" +
		"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
	check := func(t *testing.T, c net.Conn, br *bufio.Reader) {
		t.Helper()
		if _, err := io.WriteString(c, bad); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || resp.Header.Get("Retry-After") != "" || !strings.Contains(string(b), server.TypeInvalid) {
			t.Fatalf("a publication with a malformed chunk: %d %v %s, want 400 invalid", resp.StatusCode, resp.Header, b)
		}
	}
	dbErrors := regexp.MustCompile(`(?m)^fenced_database_errors_total (\S+)$`)
	metric := func(t *testing.T, url string) string {
		t.Helper()
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := dbErrors.FindSubmatch(b)
		if m == nil {
			t.Fatalf("no fenced_database_errors_total in %s", b)
		}
		return string(m[1])
	}
	t.Run("net/http", func(t *testing.T) {
		h := startServerWith(t, newStore(t, sqliteBacking(t).open(t)), nil, false)
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		check(t, c, bufio.NewReader(c))
		if n := metric(t, h.url()); n != "0" {
			t.Errorf("fenced_database_errors_total is %s after a malformed request, want 0", n)
		}
	})
	t.Run("loop", func(t *testing.T) {
		_, _, addr, events := loopService(t, sqliteBacking(t).open(t))
		c, br := loopedConn(t, addr)
		if got := <-events; got != "loop" {
			t.Fatalf("event %q, want loop", got)
		}
		check(t, c, br)
		if n := metric(t, "http://"+addr); n != "0" {
			t.Errorf("fenced_database_errors_total is %s after a malformed request, want 0", n)
		}
	})
}
