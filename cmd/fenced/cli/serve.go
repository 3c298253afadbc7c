package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced/server"
)

// shutdownGrace bounds how long serve waits for requests in flight after a signal.
const shutdownGrace = 30 * time.Second

// serveHooks let tests see the service's moments without sleeping: a connection became
// active, and the shutdown began. Nil outside tests.
var serveHooks struct {
	connActive func()
	shutdown   func()
}

type serveFlags struct {
	listen, tokens, cert, key string
	insecure, logRequests     bool
	syncConnections           bool
	maxWait                   time.Duration
}

func (a *app) serveCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve [--listen ADDR] [--tokens FILE] [--tls-cert FILE --tls-key FILE] [--insecure] [--max-wait D]",
		Short: "Serve the fenced HTTP/JSON API over the database, for programs in any language",
		Long: `serve answers the fenced API (described at /openapi.json) over the database given by --db,
until SIGINT, SIGTERM or SIGHUP (unless started under nohup); then requests in flight finish (up to ` + shutdownGrace.String() + `) and it exits.

Without --tokens the service needs no setup and answers only clients on the loopback
interface, addressed as localhost or a loopback address, and refuses requests that a browser
marks as sent by another origin's page (Origin, Sec-Fetch-Site), even on the same host. A tokens file admits bearer tokens, each with a role (reader, worker, admin) and
resource-name prefixes; "fenced serve-token" makes one. Listening beyond loopback needs TLS
(--tls-cert and --tls-key), or --insecure to accept plain HTTP on a network you trust.

Clients use --db http://HOST:PORT (or https://) with every other command, and the bearer
secret in $FENCED_API_TOKEN.

The first line on stdout is {"listening": URL} once the service accepts connections.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error { return a.serve(cmd, f) }),
	}
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:7070", "address to listen on, HOST:PORT")
	cmd.Flags().StringVar(&f.tokens, "tokens", "", "tokens file: one line per token, NAME ROLE sha256:HEX PREFIX... (default: none; loopback clients only)")
	cmd.Flags().StringVar(&f.cert, "tls-cert", "", "TLS certificate file (PEM), with --tls-key")
	cmd.Flags().StringVar(&f.key, "tls-key", "", "TLS private key file (PEM), with --tls-cert")
	cmd.Flags().BoolVar(&f.insecure, "insecure", false, "allow plain HTTP on an address beyond loopback")
	cmd.Flags().BoolVar(&f.syncConnections, "sync-connections", true, "serve the HTTP/1.1 connection of a client that asks for it (the Go remote driver's SyncTransport, which --db http:// uses) on one goroutine after its first request: fewer hand-offs per request; =false serves every request through net/http (docs/SERVICE.md)")
	cmd.Flags().DurationVar(&f.maxWait, "max-wait", server.DefaultMaxWait, "the longest wait one waiting acquisition may ask for; a client's longer wait is sent again and queues behind the waiters that arrived meanwhile, so set it at least as long as the longest wait clients use")
	cmd.Flags().BoolVar(&f.logRequests, "log-requests", false, "log every request (request id, operation, status, outcome, duration) on stderr; failures are always logged")
	return cmd
}

// loopbackHost reports whether host names only the loopback interface.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (a *app) serve(cmd *cobra.Command, f serveFlags) error {
	host, _, err := net.SplitHostPort(f.listen)
	if err != nil {
		return usagef("invalid --listen %q: use HOST:PORT, for example 127.0.0.1:7070", f.listen)
	}
	useTLS := f.cert != "" || f.key != ""
	if useTLS && (f.cert == "" || f.key == "") {
		return usagef("give --tls-cert and --tls-key together")
	}
	if !loopbackHost(host) && !useTLS && !f.insecure {
		return usagef("--listen %s reaches beyond loopback without TLS: give --tls-cert and --tls-key, or --insecure on a network you trust", f.listen)
	}
	if f.maxWait <= 0 {
		return usagef("invalid --max-wait %s: give a positive duration, for example 10m", f.maxWait)
	}
	if db := a.dbURL(cmd); strings.HasPrefix(db, "http://") || strings.HasPrefix(db, "https://") {
		return usagef("serve needs a database URL, not another fenced service")
	}
	level := slog.LevelWarn
	if f.logRequests {
		level = slog.LevelDebug
	}
	opts := &server.Options{Logger: slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level})),
		SyncConnections: f.syncConnections, MaxWait: f.maxWait}
	if f.tokens != "" {
		file, err := os.Open(f.tokens)
		if err != nil {
			return usagef("cannot read --tokens: %v", err)
		}
		opts.Tokens, err = server.ParseTokens(file)
		_ = file.Close()
		if err != nil {
			return usagef("invalid --tokens file %s: %v", f.tokens, err)
		}
	} else if !loopbackHost(host) {
		fmt.Fprintln(a.stderr, "fenced: warning: no --tokens file, so only clients on the loopback interface are answered.")
	}
	var tlsCfg *tls.Config
	if useTLS {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return usagef("cannot load --tls-cert/--tls-key: %v", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}

	store, err := a.open(cmd)
	if err != nil {
		return err
	}
	defer store.Close()
	srv, err := server.New(store, opts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		TLSConfig:         tlsCfg,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateActive && serveHooks.connActive != nil {
				serveHooks.connActive()
			}
		},
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
		ln = tls.NewListener(ln, tlsCfg)
	}
	if err := a.print(map[string]string{"listening": scheme + "://" + ln.Addr().String()}); err != nil {
		_ = ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-cmd.Context().Done():
	}
	if serveHooks.shutdown != nil {
		serveHooks.shutdown()
	}
	// Waiting acquisitions end with 503 shutting-down; other requests in flight finish, so a
	// mutation already sent to the database gets its answer.
	srv.StopWaiting()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		return fmt.Errorf("serve: shutting down: %w", err)
	}
	// Shutdown does not wait for the connections the service took over from waiters.
	if err := srv.WaitAnswered(ctx); err != nil {
		return fmt.Errorf("serve: shutting down: waiting acquisitions not answered: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func (a *app) serveTokenCmd() *cobra.Command {
	var role string
	var prefixes []string
	cmd := &cobra.Command{
		Use:   "serve-token NAME --role reader|worker|admin --prefix P [--prefix P]...",
		Short: "Make a bearer token for fenced serve: prints the secret and the tokens-file line",
		Long: `serve-token draws a new 256-bit secret and prints it with the line to add to the tokens file
of "fenced serve", as JSON {"secret": ..., "line": ...}. The line holds only the secret's
SHA-256, so the file reveals nothing; the secret is shown only now. A prefix limits the
resources the token may act on ("*" for all; an admin token must have "*").`,
		Args: oneArg("NAME"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			var r server.Role
			switch role {
			case "reader":
				r = server.RoleReader
			case "worker":
				r = server.RoleWorker
			case "admin":
				r = server.RoleAdmin
			default:
				return usagef("invalid --role %q: use reader, worker or admin", role)
			}
			if len(prefixes) == 0 {
				return usagef("missing --prefix: name the resource-name prefixes the token may act on, or \"*\" for all")
			}
			secret, line, err := server.NewSecret(args[0], r, prefixes...)
			if err != nil {
				return usagef("%v", err)
			}
			return a.print(map[string]string{"secret": secret, "line": line})
		}),
	}
	cmd.Flags().StringVar(&role, "role", "", "reader, worker or admin (required)")
	cmd.Flags().StringArrayVar(&prefixes, "prefix", nil, `resource-name prefix the token may act on; "*" for all (repeatable)`)
	_ = cmd.MarkFlagRequired("role")
	return cmd
}
