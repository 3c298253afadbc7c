package cli

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// TestRedact: every form a password takes in a URL (userinfo, escaped or not, a password=
// parameter), and the path of a private key (tls_key, key, sslkey) and its passphrase
// (sslpassword), is blanked out of a message that repeats the URL, as url.Parse's errors do.
func TestRedact(t *testing.T) {
	const secret = "S3cr3t Pw!"
	pathEsc, queryEsc := url.PathEscape(secret), url.QueryEscape(secret)
	for _, c := range []struct {
		db    string
		forms []string // what the password looks like in the URL and decoded
	}{
		{"postgres://u:" + pathEsc + "@127.0.0.1:notaport/db", []string{pathEsc, secret}},
		{"mysql://u:" + queryEsc + "@h/db", []string{queryEsc, strings.ReplaceAll(queryEsc, "%21", "!")}},
		{"redis://:" + pathEsc + "@h:1/0", []string{pathEsc, secret}},
		{"etcds://u:" + pathEsc + "@h1:1,h2:2/?ca=x", []string{pathEsc, secret}},
		{"sqlserver://h?database=x&password=" + queryEsc, []string{queryEsc, secret}},
		{"rediss://h:1/0?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=" + queryEsc, []string{queryEsc, secret}},
		{"mysql://u@h/db?tls_key=" + queryEsc + "&tls_ca=/ca.pem", []string{queryEsc, secret}},
		{"etcds://h:1/?ca=/ca.pem&cert=/c.pem&key=" + queryEsc, []string{queryEsc, secret}},
		{"postgres://u@h/db?sslmode=verify-full&sslkey=" + queryEsc + "&sslpassword=" + queryEsc, []string{queryEsc, secret}},
	} {
		_, perr := url.Parse(c.db)
		msg := fmt.Sprintf("open: %v; raw %s; decoded %s", perr, c.db, strings.Join(c.forms, " "))
		got := (&app{db: c.db}).redact(msg)
		for _, f := range c.forms {
			if strings.Contains(got, f) {
				t.Errorf("%s: %q still holds %q", c.db, got, f)
			}
		}
	}
}
