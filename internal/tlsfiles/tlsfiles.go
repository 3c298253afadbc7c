// Package tlsfiles builds a client's TLS configuration from the files a backend URL names
// (a CA bundle, a client certificate and its key), for the backends whose client library reads
// no such files from its URL itself (etcd, Redis, MariaDB/MySQL).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
)

// Files names the files a URL asked for. Empty means absent.
type Files struct {
	CA         string // PEM certificates of the CAs that sign the servers' (default: the system's roots)
	Cert, Key  string // PEM client certificate and its private key: both or neither
	ServerName string // the name the server's certificate must carry (default: the host dialled)
}

// Params are the names of the URL parameters that set Files, for messages.
type Params struct{ CA, Cert, Key string }

// Config returns a TLS 1.2+ client configuration that verifies the server against f.CA (or
// the system's roots) and presents f's client certificate. Its errors name the parameter and
// the cause, never the key file's path or contents.
func Config(f Files, p Params) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("read the CA file (%s): %w", p.CA, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the CA file %s (%s) holds no PEM certificate", f.CA, p.CA)
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("a client certificate needs both %s and %s, or neither", p.Cert, p.Key)
	}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) { // "open /path: ...": the path may be the key's
				err = fmt.Errorf("%s %s", pe.Op, pe.Err)
			}
			return nil, fmt.Errorf("load the client certificate (%s, %s): %w", p.Cert, p.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Cause words a failed TLS handshake with a server as the end of a sentence ("its certificate
// is signed by an unknown authority; name its CA with tls_ca"), with caParam the URL parameter
// that names the CA. ok is false when err is not a handshake failure this function knows.
// None of these failures sent a request: the handshake precedes every byte of one.
func Cause(err error, caParam string) (cause string, ok bool) {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		op       *net.OpError
	)
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("its certificate is signed by an unknown authority (%s names the CA file that signed it; default: the system's roots)", caParam), true
	case errors.As(err, &hostname):
		return fmt.Sprintf("its certificate is not valid for the name dialled: %v", hostname), true
	case errors.As(err, &invalid):
		return fmt.Sprintf("its certificate is not valid: %v", invalid), true
	case errors.As(err, &record):
		return "it does not answer in TLS", true
	case errors.As(err, &op) && op.Op == "remote error" && strings.Contains(op.Err.Error(), "certificate"):
		// A certificate alert comes only from a server's handshake, which under TLS 1.3 ends
		// after the client's side did: the refusal arrives on the first read.
		return fmt.Sprintf("it refused this client's certificate (%s)", op.Err), true
	}
	return "", false
}
