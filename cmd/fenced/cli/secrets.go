package cli

import (
	"net/url"
	"os"
	"strings"
)

// secretParams are the query parameters whose values are secrets in some backend's URL: a
// password, or where a private key lies (pgx's sslkey and sslpassword, etcd's key, the tls_key
// of Redis and MariaDB URLs), which says more about a host than a message needs to.
var secretParams = []string{"password", "passwd", "pass", "pwd", "token", "secret", "sslpassword", "sslkey", "key", "tls_key"}

// urlSecrets returns the secrets rawURL carries: the userinfo password and the values of
// secretParams, each as written and as decoded. It reads the URL leniently, so that a URL too
// malformed to open still has its password found.
func urlSecrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 2 { // a one-character "secret" would blank out ordinary text
			out = append(out, s)
			if d, err := url.PathUnescape(s); err == nil && d != s {
				out = append(out, d)
			}
		}
	}
	if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		authority := rest
		if i := strings.IndexAny(authority, "/?#"); i >= 0 {
			authority = authority[:i]
		}
		if userinfo, _, ok := cutLast(authority, "@"); ok {
			if _, password, ok := strings.Cut(userinfo, ":"); ok {
				add(password)
			}
		}
	}
	if _, query, ok := strings.Cut(rawURL, "?"); ok {
		for _, kv := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(kv, "=")
			for _, p := range secretParams {
				if strings.EqualFold(k, p) {
					add(v)
					if d, err := url.QueryUnescape(v); err == nil {
						add(d)
					}
				}
			}
		}
	}
	return out
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// redact replaces every secret of the URLs the command may have used (--db and $FENCED_DB) in
// msg: no error or log line of the command prints a password, whichever library wrote it.
func (a *app) redact(msg string) string {
	for _, raw := range []string{a.db, os.Getenv("FENCED_DB")} {
		for _, s := range urlSecrets(raw) {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
