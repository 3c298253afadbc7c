package server

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// Role is what a token may do. Each role includes the ones below it.
type Role int

const (
	// RoleReader may show resources, get payloads and read operation outcomes.
	RoleReader Role = iota + 1
	// RoleWorker may also provision, acquire, renew, publish, release and resolve.
	RoleWorker
	// RoleAdmin may also bump the epoch and prune operation records. An admin token is
	// global: its prefix must be "*".
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleWorker:
		return "worker"
	case RoleAdmin:
		return "admin"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

func parseRole(s string) (Role, bool) {
	for _, r := range []Role{RoleReader, RoleWorker, RoleAdmin} {
		if r.String() == s {
			return r, true
		}
	}
	return 0, false
}

// tokenPrefix starts every secret, so that a leaked one is recognisable in logs and scanners.
const tokenPrefix = "fenced_"

// NewSecret returns a fresh bearer secret (256 random bits) and the line of a tokens file that
// admits it as name with role over prefixes. Only the line is stored; the secret is shown once.
func NewSecret(name string, role Role, prefixes ...string) (secret, line string, err error) {
	if err := checkName(name); err != nil {
		return "", "", err
	}
	if _, ok := parseRole(role.String()); !ok {
		return "", "", fmt.Errorf("role %v is not reader, worker or admin", role)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	secret = tokenPrefix + hex.EncodeToString(b)
	sum := sha256.Sum256([]byte(secret))
	enc := make([]string, len(prefixes))
	for i, p := range prefixes {
		enc[i] = p
		if p != "*" {
			enc[i] = url.PathEscape(p)
		}
	}
	line = fmt.Sprintf("%s %s sha256:%s %s", name, role, hex.EncodeToString(sum[:]), strings.Join(enc, " "))
	if _, err := ParseTokens(strings.NewReader(line)); err != nil {
		return "", "", err
	}
	return secret, line, nil
}

func checkName(name string) error {
	if name == "" || strings.ContainsFunc(name, func(c rune) bool { return c <= ' ' || c > '~' }) {
		return fmt.Errorf("token name %q must be printable ASCII without spaces", name)
	}
	return nil
}

// Tokens is a parsed tokens file: who may do what. It is safe for concurrent use (read-only).
//
// The file holds one token per line; blank lines and lines starting with # are ignored:
//
//	NAME ROLE sha256:HEX PREFIX...
//
// ROLE is reader, worker or admin; HEX is the SHA-256 of the secret, so the file holds no
// secret. Each PREFIX is a resource-name prefix the token may act on, percent-encoded (a
// space as %20), or "*" for every resource (admin tokens must have exactly "*"). A prefix is matched on bytes: "builds/"
// covers "builds/x" but not "builds".
type Tokens struct {
	byHash map[[32]byte]*principal
}

type principal struct {
	name     string
	role     Role
	all      bool
	prefixes []string
}

// ParseTokens reads a tokens file. Errors name the line.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{byHash: map[[32]byte]*principal{}}
	sc := bufio.NewScanner(r)
	names := map[string]bool{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			return nil, fmt.Errorf("tokens line %d: want NAME ROLE sha256:HEX PREFIX..., got %d fields", n, len(f))
		}
		if err := checkName(f[0]); err != nil {
			return nil, fmt.Errorf("tokens line %d: %w", n, err)
		}
		if names[f[0]] {
			return nil, fmt.Errorf("tokens line %d: the name %q is used twice", n, f[0])
		}
		names[f[0]] = true
		role, ok := parseRole(f[1])
		if !ok {
			return nil, fmt.Errorf("tokens line %d: role %q is not reader, worker or admin", n, f[1])
		}
		hexSum, ok := strings.CutPrefix(f[2], "sha256:")
		raw, err := hex.DecodeString(hexSum)
		if !ok || err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("tokens line %d: the hash must be sha256: and 64 hex digits", n)
		}
		p := &principal{name: f[0], role: role}
		for _, pre := range f[3:] {
			if pre == "*" {
				p.all = true
				continue
			}
			dec, err := url.PathUnescape(pre)
			if err != nil {
				return nil, fmt.Errorf("tokens line %d: prefix %q is not percent-encoded correctly", n, pre)
			}
			p.prefixes = append(p.prefixes, dec)
		}
		if p.all && len(p.prefixes) > 0 {
			return nil, fmt.Errorf("tokens line %d: \"*\" already covers every prefix; give it alone", n)
		}
		if role == RoleAdmin && !p.all {
			return nil, fmt.Errorf("tokens line %d: an admin token bumps the epoch of every resource, so its prefix must be \"*\"", n)
		}
		sum := [32]byte(raw)
		if _, dup := t.byHash[sum]; dup {
			return nil, fmt.Errorf("tokens line %d: the same secret hash appears twice", n)
		}
		t.byHash[sum] = p
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	if len(t.byHash) == 0 {
		return nil, fmt.Errorf("the tokens file admits nobody: add a line NAME ROLE sha256:HEX PREFIX")
	}
	return t, nil
}

// covers reports whether the principal may act on resource.
func (p *principal) covers(resource string) bool {
	if p.all {
		return true
	}
	for _, pre := range p.prefixes {
		if strings.HasPrefix(resource, pre) {
			return true
		}
	}
	return false
}

// local is the principal of an unauthenticated request from loopback when no tokens are set.
var local = &principal{name: "loopback", role: RoleAdmin, all: true}

func forbidden(detail string) Problem {
	return Problem{Type: TypeForbidden, Status: http.StatusForbidden, Title: "forbidden", Detail: detail, Applied: &no}
}

// authenticate finds the request's principal: by its bearer secret's hash, or, with no
// tokens configured, the loopback principal for a loopback peer.
func (s *Server) authenticate(r *http.Request) (*principal, *Problem) {
	if s.opts.Tokens == nil {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			p := forbidden("this service has no tokens file, so it answers only clients on the loopback interface")
			return nil, &p
		}
		if p := browserGuard(r); p != nil {
			return nil, p
		}
		return local, nil
	}
	unauth := func(detail string) (*principal, *Problem) {
		return nil, &Problem{Type: TypeUnauthenticated, Status: http.StatusUnauthorized, Title: "unauthenticated",
			Detail: detail, Applied: &no}
	}
	h := r.Header.Get("Authorization")
	scheme, secret, ok := strings.Cut(h, " ")
	if h == "" {
		return unauth("the request has no Authorization header; send Authorization: Bearer SECRET")
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return unauth("the Authorization header is not of the form Bearer SECRET")
	}
	// A map lookup by hash: the secret itself is never compared, so its timing tells nothing.
	p, found := s.opts.Tokens.byHash[sha256.Sum256([]byte(strings.TrimSpace(secret)))]
	if !found {
		return unauth("the bearer token is not in the tokens file")
	}
	return p, nil
}

// browserGuard refuses, when no tokens are set, the requests that a web page open in the
// operator's browser could make to a loopback service, which would otherwise act as admin: a
// Host that is not a loopback name (a page whose own name was rebound to 127.0.0.1, which could
// then read the answers), and a request that the browser marks as sent by another site or
// origin (a cross-site POST needs no preflight when its body is not JSON or it has none). The
// CLI and other programs send a loopback Host and neither Sec-Fetch-Site nor Origin; the
// dashboard page reads its own API, which is same-origin.
func browserGuard(r *http.Request) *Problem {
	host, port := splitHost(r.Host)
	if !loopbackName(host) {
		p := forbidden(fmt.Sprintf("this service has no tokens file, so it refuses a request addressed to Host %q, which is not localhost or a loopback address (a web page could send it by rebinding its own name to this machine)", r.Host))
		return &p
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		p := forbidden(fmt.Sprintf("this service has no tokens file, so it refuses a request that a browser sent from another origin (Sec-Fetch-Site: %s)", site))
		return &p
	}
	if origin, sent := r.Header["Origin"]; sent {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		if len(origin) != 1 || !sameOrigin(origin[0], scheme, host, port) {
			p := forbidden(fmt.Sprintf("this service has no tokens file, so it refuses a request that a web page of another origin sent (Origin: %s)", strings.Join(origin, ", ")))
			return &p
		}
	}
	return nil
}

// splitHost splits a Host header into its host (IPv6 without brackets) and port ("" if none).
func splitHost(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		return hostport[1 : len(hostport)-1], ""
	}
	return hostport, ""
}

// loopbackName reports whether host is "localhost" or a loopback address (127.0.0.0/8, ::1).
func loopbackName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host) // unlike net.ParseIP, allocates nothing
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}

// sameOrigin reports whether origin (an Origin header) is scheme://host:port, the request's own
// origin; a missing port is the scheme's default on either side.
func sameOrigin(origin, scheme, host, port string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != scheme || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return false
	}
	defaultPort := map[string]string{"http": "80", "https": "443"}[scheme]
	oport := u.Port()
	if oport == "" {
		oport = defaultPort
	}
	if port == "" {
		port = defaultPort
	}
	return strings.EqualFold(u.Hostname(), host) && oport == port
}

// authorize checks the role and, for a route on a resource, the prefixes.
func (p *principal) authorize(need Role, resource string) *Problem {
	if p.role < need {
		f := forbidden(fmt.Sprintf("token %q has role %s; this operation needs %s", p.name, p.role, need))
		return &f
	}
	if resource != "" && !p.covers(resource) {
		f := forbidden(fmt.Sprintf("token %q may not act on resource %q (outside its prefixes)", p.name, resource))
		return &f
	}
	return nil
}
