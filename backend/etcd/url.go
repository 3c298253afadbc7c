package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced/internal/tlsfiles"
)

// clientURL is what Open reads from its URL.
type clientURL struct {
	endpoints          []string
	prefix             string
	username, password string
	tls                *tls.Config // nil: plain gRPC
}

// The URL's query parameters. Any other is refused, so that a misspelt ca or cert is an error
// rather than a connection made without it.
const (
	paramPrefix     = "prefix"
	paramCA         = "ca"          // PEM file of the CA certificates that sign the servers'
	paramCert       = "cert"        // PEM file of the client certificate
	paramKey        = "key"         // PEM file of the client certificate's private key
	paramServerName = "server_name" // the name the servers' certificates must carry
)

// parseURL reads etcd://[user:password@]host:port[,host:port...][/][?prefix=P] (plain gRPC)
// or etcds://... (TLS) with, for TLS, ca=FILE (default: the system's roots), cert=FILE and
// key=FILE (a client certificate, both or neither) and server_name=NAME. user and password,
// on either scheme, authenticate to etcd's own auth (clientv3.Config Username and Password).
// TLS parameters on etcd:// are refused: a connection is never made in plain text when the
// URL asks for TLS. Its errors never repeat the URL, which may hold a password.
func parseURL(rawURL string) (clientURL, error) {
	var c clientURL
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the whole URL, password included
		}
		return c, fmt.Errorf("parse the etcd URL: %w", err)
	}
	if u.Scheme != "etcd" && u.Scheme != "etcds" || u.Host == "" {
		return c, errors.New("the etcd URL must be etcd://host:port[,host:port...] or etcds://... for TLS")
	}
	for ep := range strings.SplitSeq(u.Host, ",") {
		if ep == "" {
			return c, fmt.Errorf("the etcd URL's host list %q has an empty endpoint", u.Host)
		}
		c.endpoints = append(c.endpoints, ep)
	}
	if u.User != nil {
		c.username = u.User.Username()
		c.password, _ = u.User.Password()
		if c.username == "" {
			return c, errors.New("the etcd URL has a password but no user name")
		}
	}
	q := u.Query()
	for k := range q {
		switch k {
		case paramPrefix, paramCA, paramCert, paramKey, paramServerName:
		default:
			return c, fmt.Errorf("the etcd URL has an unknown parameter %q; known: prefix, ca, cert, key, server_name", k)
		}
	}
	c.prefix = q.Get(paramPrefix)
	tlsParams := q.Has(paramCA) || q.Has(paramCert) || q.Has(paramKey) || q.Has(paramServerName)
	if u.Scheme == "etcd" {
		if tlsParams {
			return c, errors.New("the etcd URL has TLS parameters (ca, cert, key, server_name) on etcd://, which is plain text; use etcds://")
		}
		return c, nil
	}
	c.tls = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: q.Get(paramServerName)}
	if ca := q.Get(paramCA); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return c, fmt.Errorf("read the etcd CA file: %w", err)
		}
		c.tls.RootCAs = x509.NewCertPool()
		if !c.tls.RootCAs.AppendCertsFromPEM(pem) {
			return c, fmt.Errorf("the etcd CA file %s holds no PEM certificate", ca)
		}
	}
	cert, key := q.Get(paramCert), q.Get(paramKey)
	if (cert == "") != (key == "") {
		return c, errors.New("the etcd URL needs both cert and key for a client certificate, or neither")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return c, fmt.Errorf("load the etcd client certificate: %w", err)
		}
		c.tls.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// diagnose explains a failure to connect that the client reports only as a timeout: it makes
// one TLS handshake with each endpoint itself, with the URL's settings, and reports the first
// refusal (an unknown CA, a client certificate the server rejects), or, for etcd://, that the
// server speaks TLS; when no endpoint accepts a TCP connection at all, it says so with the
// cause. It returns err unchanged when it finds nothing better.
func diagnose(c clientURL, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var unreachable []string // endpoints where nothing accepted a connection, and why
	for _, ep := range c.endpoints {
		dialer := &net.Dialer{Timeout: 2 * time.Second}
		conn, derr := dialer.Dial("tcp", ep)
		if derr != nil {
			unreachable = append(unreachable, dialCause(derr))
			continue
		}
		_ = conn.Close()
		if c.tls == nil {
			probe := &tls.Config{InsecureSkipVerify: true} // only to learn whether it speaks TLS
			conn, herr := tls.DialWithDialer(dialer, "tcp", ep, probe)
			if herr == nil {
				_ = conn.Close()
				return fmt.Errorf("etcd at %s speaks TLS and this URL is etcd:// (plain text); use etcds://: %w", ep, err)
			}
			continue
		}
		if herr := handshake(c, dialer, ep); herr != nil {
			return herr
		}
	}
	if len(unreachable) == len(c.endpoints) {
		where := "the etcd server at "
		if len(c.endpoints) > 1 {
			where = "any of the etcd servers at "
		}
		return &connError{msg: fmt.Sprintf("cannot connect to %s%s: %s", where, strings.Join(c.endpoints, ", "), unreachable[0]), err: err}
	}
	return err
}

// handshake makes one TLS handshake with ep, with the URL's settings, and returns the
// server's refusal or the client's (an unknown CA, a certificate not valid for the name, a
// client certificate refused), or nil when it succeeds or when ep is not reachable at all.
func handshake(c clientURL, dialer *net.Dialer, ep string) error {
	cfg := c.tls.Clone()
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(dialer, "tcp", ep, cfg)
	if err == nil {
		// Under TLS 1.3 the server checks the client's certificate after the client's side of
		// the handshake is done: its refusal arrives as an alert on the first read, where a
		// gRPC server that accepted sends its HTTP/2 settings at once.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	if err == nil {
		return nil
	}
	if cause, ok := tlsfiles.Cause(err, paramCA); ok {
		return &connError{msg: fmt.Sprintf("cannot connect to the etcd server at %s: %s", ep, cause), err: err}
	}
	if strings.Contains(err.Error(), "tls:") || strings.Contains(err.Error(), "x509") {
		return fmt.Errorf("TLS handshake with etcd at %s failed: %w", ep, err)
	}
	return nil // not reachable, or no answer within the second: the client says so
}

// checkTLS makes a handshake with every endpoint of an etcds:// URL, at once, before the client
// dials: clientv3 retries a handshake the server refuses until its dial timeout, and would report
// a certificate problem only as that timeout. An endpoint that does not answer is left to the
// client.
func checkTLS(c clientURL) error {
	errs := make([]error, len(c.endpoints))
	var wg sync.WaitGroup
	for i, ep := range c.endpoints {
		wg.Go(func() { errs[i] = handshake(c, &net.Dialer{Timeout: 2 * time.Second}, ep) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// dialCause is the reason a TCP dial failed, without the addresses ("connection refused").
func dialCause(err error) string {
	var (
		dns   *net.DNSError
		errno syscall.Errno
		op    *net.OpError
	)
	switch {
	case errors.As(err, &dns):
		return dns.Err
	case errors.As(err, &errno):
		return errno.Error()
	case errors.As(err, &op) && op.Timeout():
		return "timed out"
	}
	return err.Error()
}
