// Package redis runs the fenced protocol on one Redis 7 (or later) server, through go-redis.
//
// Each resource is one hash, stored under Options.KeyPrefix + "r:{" + name + "}", and each
// operation is one Lua script: Redis runs a script to its end before it serves anything else,
// so the conditional check and the writes are one atomic step on the server. Expiry is judged
// by the server's clock (TIME, read inside the script), never by a client's; that is the
// primary's wall clock, so a step of that clock moves every expiry with it. The lease is a
// field compared with TIME, not a key expiry: the hash is never deleted, and its generation
// survives every release and expiry. scripts.go describes the keys and fields.
//
// # One server, not Redis Cluster
//
// A lease-carrying script reads the store's epoch key besides the resource's hash, and a
// publication records its operation id under a key of its own in the same script. Those keys
// live in different hash slots, so the scripts cannot run on Redis Cluster, and they are
// flagged no-cluster: a cluster node refuses them before running anything, and Migrate refuses a
// *redis.ClusterClient. Putting every key under the resource's hash tag would make them run,
// but then an operation id could only be found together with its resource, and Resolve takes
// the id alone; the epoch would also have to be copied into every slot. A single primary
// (optionally with replicas and Sentinel, see below) is the supported deployment.
//
// # Durability and failover
//
// The fence is only as durable as the server's copy of the generation. Redis acknowledges a
// write before it reaches the disk unless it runs with
//
//	appendonly yes
//	appendfsync always
//
// With RDB snapshots only, or appendfsync everysec, a crash can lose the last acknowledged
// acquisitions, and an old token becomes valid again after the restart. Replication is
// asynchronous: when a replica is promoted (Sentinel failover) it may lack the newest
// acquisitions, which rolls generations back in the same way (WAIT after each write would not
// change that: the failover need not pick a replica that acknowledged).
//
// Tokens stay unique across those losses without an operator. The epoch key is created at the
// server's TIME in microseconds since 1970 and every bump sets it to max(epoch + 1, TIME), so a
// store lost entirely (a restart without persistence, FLUSHDB) starts above every epoch it had.
// A restart from an older snapshot or a promotion keeps the keys but loses history; the server
// then reports a new run_id or master_replid, and the first lease-carrying script after it
// bumps the epoch itself (scripts.go, "Restarts and promotions"). Both rest on one assumption:
// the server's clock does not go back across the loss, to before the epoch it had (run it with
// NTP; a clock set back by more than the time since the last bump would let a store created
// after a total loss start at or below its old epoch, and issue old tokens again). What no
// bump brings back is the lost data: a publication acknowledged and then lost is gone, and a
// reader may see an older payload. Driver.CheckDurability reports a server configured so.
//
// # Unknown outcomes and retries
//
// A script whose reply was lost may have run. go-redis would resend it on the next connection,
// which can turn "may have happened" into a wrong refusal (a resent publication is refused as
// already published), so Open disables go-redis retries; a client passed to New should be
// built with MaxRetries: -1 for the same reason. An error is reported as not applied
// (driver.ErrNotApplied) only when the script certainly did not run or wrote nothing: the
// context was done before sending, no connection could be had (dial failure, pool timeout,
// closed client), or the server answered with an error, since every script checks everything
// before its first write (scripts.go). A read or write error on the connection after sending,
// or a timeout waiting for the reply, leaves the outcome unknown.
//
// # Waking waiters
//
// The release, publish-and-release and bump-epoch scripts PUBLISH the freed resource's key (the
// epoch key for a bump) on the channel KeyPrefix + "released", after their checks and before
// their first write; fenced.Store.AcquireWait's waiters subscribe on one connection per Driver
// (NotifyReleased). A Redis user restricted by an ACL needs that channel (&fenced:released with
// the default prefix): without it those scripts are refused, and write nothing. Pub/sub is not
// persisted: while the subscription's connection is down, messages are lost, so its loss wakes
// every waiter, and they poll until go-redis has subscribed again. The end of a lease's TTL
// publishes nothing (it is a field compared with TIME): waiters time that retry from the
// server's clock.
//
// # Payloads
//
// Redis stores strings of up to 512 MB (proto-max-bulk-len), but a payload is copied into the
// script's memory and into the hash while the single server thread serves no one else, and the
// append-only file and every replica receive it in full. Keep payloads to a few MiB: fenced's
// default limit of 4 MiB (fenced.Config.MaxPayloadBytes) is a sensible ceiling.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/tlsfiles"
)

// DefaultKeyPrefix is Options.KeyPrefix when it is empty.
const DefaultKeyPrefix = "fenced:"

// schemaVersion is the layout of the keys that this driver reads and writes. Version 2 added
// the epoch key, operation records and source versions; version 3 the incarnation key, which a
// version-2 driver would not check.
const schemaVersion = 3

// Options configures a Driver. A nil *Options means the defaults. Options is read once by New
// and may be reused afterwards.
type Options struct {
	// KeyPrefix is prepended to every key the driver uses, so that several applications can
	// share a database. Default DefaultKeyPrefix.
	KeyPrefix string
}

// Driver is the Redis backend. It is safe for concurrent use by multiple goroutines, as the
// go-redis client it uses is.
type Driver struct {
	client goredis.UniversalClient
	prefix string
	owned  bool
	listen listener // NotifyReleased's pub/sub connection and subscribers (notify.go)
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a client the caller opened and keeps ownership of. The client
// should be built with MaxRetries: -1 (see the package documentation).
func New(client goredis.UniversalClient, opts *Options) *Driver {
	prefix := DefaultKeyPrefix
	if opts != nil && opts.KeyPrefix != "" {
		prefix = opts.KeyPrefix
	}
	return &Driver{client: client, prefix: prefix}
}

// The URL parameters of fenced's own, beside go-redis's.
const (
	paramKeyPrefix     = "key_prefix"
	paramTLSCA         = "tls_ca"          // PEM file of the CAs that sign the server's certificate
	paramTLSCert       = "tls_cert"        // PEM file of the client certificate
	paramTLSKey        = "tls_key"         // PEM file of the client certificate's private key
	paramTLSServerName = "tls_server_name" // the name the server's certificate must carry
)

// Open connects to a URL of the form redis://[user:password@]host:port/db (or rediss:// for
// TLS, or unix://path), with go-redis's query options (pool_size, dial_timeout, skip_verify,
// ...) and fenced's own: key_prefix, default DefaultKeyPrefix, and for rediss:// tls_ca=FILE
// (default: the system's roots), tls_cert=FILE and tls_key=FILE (a client certificate, both or
// neither) and tls_server_name=NAME (default: the host). TLS parameters on redis:// are
// refused: a URL that asks for TLS never connects in plain text. It disables go-redis retries
// (of commands, refusing a max_retries option, and of dials: one dial per connection attempt).
// The returned driver owns its client and closes it in Close. Open does not contact the
// server; a TLS failure is the first operation's error, not applied.
func Open(rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the whole URL, password included
		}
		return nil, fmt.Errorf("open redis: parse url: %w", err)
	}
	q := u.Query()
	if q.Has("max_retries") {
		return nil, errors.New("open redis: max_retries is not allowed: a resent script could be applied twice")
	}
	prefix := q.Get(paramKeyPrefix)
	files := tlsfiles.Files{CA: q.Get(paramTLSCA), Cert: q.Get(paramTLSCert), Key: q.Get(paramTLSKey), ServerName: q.Get(paramTLSServerName)}
	tlsParams := false
	for _, k := range []string{paramTLSCA, paramTLSCert, paramTLSKey, paramTLSServerName} {
		tlsParams = tlsParams || q.Has(k)
		q.Del(k)
	}
	q.Del(paramKeyPrefix)
	if tlsParams && u.Scheme != "rediss" {
		return nil, errors.New("open redis: the URL has TLS parameters (tls_ca, tls_cert, tls_key, tls_server_name) on " + u.Scheme + "://, which is plain text; use rediss://")
	}
	u.RawQuery = q.Encode()
	opt, err := goredis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("open redis: %w", err)
	}
	if tlsParams {
		cfg, err := tlsfiles.Config(files, tlsfiles.Params{CA: paramTLSCA, Cert: paramTLSCert, Key: paramTLSKey})
		if err != nil {
			return nil, fmt.Errorf("open redis: %w", err)
		}
		if cfg.ServerName == "" {
			cfg.ServerName = opt.TLSConfig.ServerName // the host, as go-redis sets it
		}
		cfg.InsecureSkipVerify = opt.TLSConfig.InsecureSkipVerify // skip_verify=true, go-redis's own
		opt.TLSConfig = cfg
	}
	opt.MaxRetries = -1
	// One dial per connection attempt: a failed dial is reported at once as not applied, and
	// the caller decides whether to try again (Run at its next renewal, a user after reading
	// the message); go-redis's default of 5 attempts only delays that answer, by up to
	// 5 x dial_timeout against an address that does not answer.
	opt.DialerRetries = 1
	d := New(goredis.NewClient(opt), &Options{KeyPrefix: prefix})
	d.owned = true
	return d, nil
}

// addr is the configured server address, for messages.
func (d *Driver) addr() string {
	if c, ok := d.client.(*goredis.Client); ok {
		return c.Options().Addr
	}
	return "its configured address"
}

// Client returns the underlying client.
func (d *Driver) Client() goredis.UniversalClient { return d.client }

// Key returns the key of the resource's hash, for inspection with redis-cli.
func (d *Driver) Key(resource string) string { return d.prefix + "r:{" + resource + "}" }

// Close closes the client if Open created it.
func (d *Driver) Close() error {
	d.stopListening()
	if d.owned {
		return d.client.Close()
	}
	return nil
}

var _ driver.DurabilityChecker = (*Driver)(nil)

// CheckDurability returns a warning unless the server the client reaches runs with
// appendonly yes and appendfsync always, the configuration under which an acknowledged
// generation survives a crash, and with a maxmemory-policy that cannot evict fenced's keys. It
// needs the CONFIG command, which some hosted services refuse; when the settings cannot be
// read it returns the error, and the store decides (fenced.Config StrictDurability). On a
// replica set, check the primary and each replica that could be promoted.
func (d *Driver) CheckDurability(ctx context.Context) ([]string, error) {
	cfg, err := d.client.ConfigGet(ctx, "append*").Result()
	if err != nil {
		return nil, fmt.Errorf("read redis config: %w", err)
	}
	var out []string
	if v := cfg["appendonly"]; v != "yes" {
		out = append(out, fmt.Sprintf("Redis appendonly is %q, not \"yes\": a crash loses every write since the last snapshot", v))
	}
	if v := cfg["appendfsync"]; v != "always" {
		out = append(out, fmt.Sprintf("Redis appendfsync is %q, not \"always\": a crash can lose acknowledged writes", v))
	}
	// fenced's keys carry no expiry, so only an allkeys-* policy can evict them: an evicted
	// resource hash, provisioned again, would issue its generations again under the same epoch.
	policy, err := d.client.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return nil, fmt.Errorf("read redis config: %w", err)
	}
	if v := policy["maxmemory-policy"]; strings.HasPrefix(v, "allkeys-") {
		out = append(out, fmt.Sprintf("Redis maxmemory-policy is %q: under memory pressure it evicts fenced's keys, and their generations with them", v))
	}
	return out, nil
}

// Migrate has no schema to create: it records the layout version under KeyPrefix + "schema",
// creates the epoch key (KeyPrefix + "epoch") at the server's clock in microseconds, with the
// server's incarnation, where it is absent, and refuses to work on
// data that a newer layout wrote. It also loads every script into the server's cache, so that
// the first run of each is a single EVALSHA.
func (d *Driver) Migrate(ctx context.Context) error {
	if _, ok := d.client.(*goredis.ClusterClient); ok {
		return errors.New("migrate: Redis Cluster is not supported (see the package documentation)")
	}
	key := d.prefix + "schema"
	v, err := d.run(ctx, scriptMigrate, "migrate", []string{key, d.epochKey(), d.incarnationKey()}, schemaVersion).Int64()
	if err != nil {
		return err
	}
	if v > schemaVersion {
		return fmt.Errorf("check schema: %s records version %d; this driver knows version %d", key, v, schemaVersion)
	}
	for _, s := range allScripts {
		if err := s.Load(ctx, d.client).Err(); err != nil {
			return fmt.Errorf("load scripts: %w", err)
		}
	}
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	return d.run(ctx, scriptProvision, "provision", []string{d.Key(resource)}).Err()
}

func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	r, err := d.run(ctx, scriptAcquire, "acquire", d.leaseKeys(resource), owner, ttl.Microseconds()).Int64Slice()
	if err != nil {
		return driver.Grant{}, err
	}
	if len(r) != 4 {
		return driver.Grant{}, fmt.Errorf("read acquire reply: %d values, want 4", len(r))
	}
	switch r[0] {
	case 1:
		return driver.Grant{Epoch: r[1], Generation: r[2], LeaseUntil: fromMicros(r[3])}, nil
	case 0:
		return driver.Grant{}, &driver.BusyError{Epoch: r[1], Generation: r[2], LeaseUntil: fromMicros(r[3])}
	default:
		return driver.Grant{}, driver.ErrNotFound
	}
}

func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	until, err := d.run(ctx, scriptRenew, "renew", d.leaseKeys(l.Resource),
		l.Owner, l.Generation, l.Epoch, ttl.Microseconds()).Int64()
	if err != nil || until == 0 {
		return time.Time{}, false, err
	}
	return fromMicros(until), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, scriptPublish, "publish", l, pub)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, scriptPublishAndRelease, "publish-and-release", l, pub)
}

// publish runs one publication script: the payload and the accepted operation record are
// written by the same script, so both happen or neither does.
func (d *Driver) publish(ctx context.Context, s *goredis.Script, name string, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	keys := []string{d.Key(l.Resource), d.epochKey(), d.incarnationKey(), d.OperationKey(pub.OpID)}
	return d.ok(ctx, s, name, keys, l.Owner, l.Generation, l.Epoch, pub.Payload, pub.SourceVersion, l.Resource,
		d.releasedChannel())
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return d.ok(ctx, scriptRelease, "release", d.leaseKeys(l.Resource), l.Owner, l.Generation, l.Epoch,
		d.releasedChannel())
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	r, err := d.run(ctx, scriptRead, "read", d.leaseKeys(resource)).Slice()
	if err != nil {
		return driver.State{}, err
	}
	const fields = 12
	if len(r) != fields {
		return driver.State{}, fmt.Errorf("read read reply: %d values, want %d", len(r), fields)
	}
	var (
		n     [fields]int64
		owner string
	)
	for i, v := range r {
		var ok bool
		if i == 3 {
			owner, ok = v.(string)
		} else {
			n[i], ok = v.(int64)
		}
		if !ok {
			return driver.State{}, fmt.Errorf("read read reply: value %d is %T", i, v)
		}
	}
	if n[0] == 0 {
		return driver.State{}, driver.ErrNotFound
	}
	return driver.State{
		Resource:            resource,
		Epoch:               n[1],
		Generation:          n[2],
		Owner:               owner,
		LeaseUntil:          fromMicros(n[4]),
		PublishedEpoch:      n[5],
		PublishedGeneration: n[6],
		PublishedAt:         fromMicros(n[7]),
		SourceVersion:       n[8],
		PayloadSize:         n[9],
		CurrentEpoch:        n[10],
		Now:                 fromMicros(n[11]),
	}, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	r, err := d.run(ctx, scriptReadPayload, "read-payload", []string{d.Key(resource)}).Slice()
	if err != nil {
		return nil, 0, err
	}
	if len(r) != 3 {
		return nil, 0, fmt.Errorf("read read-payload reply: %d values, want 3", len(r))
	}
	exists, ok1 := r[0].(int64)
	gen, ok2 := r[1].(int64)
	payload, ok3 := r[2].(string)
	switch {
	case !ok1 || !ok2 || !ok3:
		return nil, 0, fmt.Errorf("read read-payload reply: unexpected types %T, %T, %T", r[0], r[1], r[2])
	case exists == 0:
		return nil, 0, driver.ErrNotFound
	case gen == 0:
		return nil, 0, nil
	}
	return []byte(payload), gen, nil
}

func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	return d.operation(ctx, scriptResolve, "resolve", opID)
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	return d.operation(ctx, scriptReadOperation, "read-operation", opID)
}

// operation runs a script that returns an operation record's fields {outcome, resource, epoch,
// generation, recorded_at_us}, each a string or nil when absent.
func (d *Driver) operation(ctx context.Context, s *goredis.Script, name, opID string) (driver.Operation, error) {
	op := driver.Operation{OpID: opID}
	r, err := d.run(ctx, s, name, []string{d.OperationKey(opID)}).Slice()
	if err != nil {
		return op, err
	}
	if len(r) != 5 {
		return op, fmt.Errorf("read %s reply: %d values, want 5", name, len(r))
	}
	str := make([]string, len(r))
	for i, v := range r {
		switch v := v.(type) {
		case nil:
		case string:
			str[i] = v
		default:
			return op, fmt.Errorf("read %s reply: value %d is %T", name, i, v)
		}
	}
	num := func(i int) (int64, error) {
		if str[i] == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(str[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read %s reply: %w", name, err)
		}
		return n, nil
	}
	op.Outcome, op.Resource = str[0], str[1]
	var at int64
	for i, dst := range []*int64{&op.Epoch, &op.Generation, &at} {
		if *dst, err = num(i + 2); err != nil {
			return driver.Operation{OpID: opID}, err
		}
	}
	op.RecordedAt = fromMicros(at)
	return op, nil
}

// BumpEpoch sets the epoch key to max(epoch + 1, the server's TIME in microseconds) and records
// the server's incarnation. That fences every lease of an earlier epoch at once: every
// lease-carrying script compares the lease's epoch with the current one (scripts.go).
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	return d.run(ctx, scriptBumpEpoch, "bump-epoch", []string{d.epochKey(), d.incarnationKey()},
		d.releasedChannel()).Int64()
}

// pruneBatch bounds the keys one prune script declares (and unpacks into one DEL).
const pruneBatch = 500

// PruneOperations lists the operation keys with SCAN and deletes those recorded before the
// server's now - age, a batch of keys per script. Each script checks the age of every key it
// deletes, so a record written since the SCAN is never deleted early; the whole prune is not
// one atomic step, and need not be.
func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	var total int64
	flush := func(keys []string) error {
		if len(keys) == 0 {
			return nil
		}
		n, err := d.run(ctx, scriptPrune, "prune", keys, age.Microseconds()).Int64()
		total += n
		return err
	}
	var batch []string
	iter := d.client.Scan(ctx, 0, escapeGlob(d.prefix)+"op:*", pruneBatch).Iterator()
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == pruneBatch {
			if err := flush(batch); err != nil {
				return total, err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return total, fmt.Errorf("scan operation keys: %w", err)
	}
	return total, flush(batch)
}

// OperationKey returns the key of an operation id's record, for inspection with redis-cli.
func (d *Driver) OperationKey(opID string) string { return d.prefix + "op:" + opID }

func (d *Driver) epochKey() string { return d.prefix + "epoch" }

// EpochKey returns the key of the store's epoch, for inspection with redis-cli and for fenced
// torture's restore fault, which copies it with the resources' hashes.
func (d *Driver) EpochKey() string { return d.epochKey() }

func (d *Driver) incarnationKey() string { return d.prefix + "incarnation" }

// leaseKeys are the keys of every lease-carrying script: the resource's hash, the epoch and the
// recorded incarnation.
func (d *Driver) leaseKeys(resource string) []string {
	return []string{d.Key(resource), d.epochKey(), d.incarnationKey()}
}

// run runs one script (EVALSHA, falling back to EVAL when the server has not cached it) and
// classifies and wraps its error in one place. A context already done is reported before
// anything is sent.
func (d *Driver) run(ctx context.Context, s *goredis.Script, name string, keys []string, args ...any) *goredis.Cmd {
	if err := ctx.Err(); err != nil {
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(fmt.Errorf("run %s script: %w", name, driver.NotApplied(err)))
		return cmd
	}
	cmd := s.Run(ctx, d.client, keys, args...)
	if err := cmd.Err(); err != nil {
		if cf := connectionFailure(d.addr(), err); cf != nil {
			cmd.SetErr(driver.NotApplied(cf)) // says it all: which script is beside the point
		} else if tf := d.plainToTLS(err); tf != nil {
			cmd.SetErr(driver.NotApplied(tf))
		} else {
			cmd.SetErr(fmt.Errorf("run %s script: %w", name, classify(err)))
		}
	}
	return cmd
}

// plainToTLS explains a connection closed without an answer (EOF, reset) on a client without
// TLS: when the server completes a TLS handshake, it speaks only TLS on that port, the URL
// should be rediss://, and nothing sent in plain text was run (a TLS server reads those bytes
// as a malformed record and drops the connection). It returns nil for any other case. The
// probe sends nothing but a handshake, and verifies nothing: it only learns whether TLS answers.
func (d *Driver) plainToTLS(err error) error {
	c, ok := d.client.(*goredis.Client)
	if !ok || c.Options().TLSConfig != nil || !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	opt := c.Options()
	conn, herr := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, opt.Network, opt.Addr,
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // no data is exchanged
	if herr != nil {
		return nil
	}
	_ = conn.Close()
	return &connError{msg: fmt.Sprintf("the Redis server at %s speaks TLS and this URL is redis:// (plain text); use rediss://", opt.Addr), err: err}
}

// connError is a failure to connect, in the user's terms; go-redis's error stays reachable
// with errors.As.
type connError struct {
	msg string
	err error
}

func (e *connError) Error() string { return e.msg }
func (e *connError) Unwrap() error { return e.err }

// connectionFailure words a dial failure or a failed TLS handshake as one sentence naming the
// server and the cause ("connection refused", "its certificate is signed by an unknown
// authority"), or returns nil for any other error. Nothing was sent. addr is the
// client's configured address, named when the dial failed before it had one (a DNS failure).
func connectionFailure(addr string, err error) error {
	if cause, ok := tlsfiles.Cause(err, paramTLSCA); ok {
		return &connError{msg: fmt.Sprintf("cannot connect to the Redis server at %s: %s", addr, cause), err: err}
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return nil
	}
	var (
		dns   *net.DNSError
		errno syscall.Errno
		cause string
	)
	switch {
	case errors.As(err, &dns):
		cause = dns.Error()
	case errors.As(err, &errno):
		cause = errno.Error()
	case op.Timeout():
		cause = "timed out"
	default:
		cause = op.Err.Error()
	}
	if op.Addr != nil {
		addr = op.Addr.String() // the address dialled, resolved
	}
	return &connError{msg: fmt.Sprintf("cannot connect to the Redis server at %s: %s", addr, cause), err: err}
}

// classify marks the errors after which a script certainly did not take effect:
//   - a server error reply: the script was refused before it ran (NOSCRIPT, a flags check such
//     as OOM or READONLY, a wrong number of keys) or raised an error, which every script does
//     only before its first write (see scripts.go), so nothing was written;
//   - no connection: dialing failed, the pool had none to give, or the client was closed;
//     nothing was sent.
//
// Anything else (a broken connection, a read timeout, a context that ended while waiting for
// the reply) may come after the server ran the script, and stays an unknown outcome. A nil
// reply is not an error reply: the script ran to its end.
func classify(err error) error {
	var (
		serverErr goredis.Error
		opErr     *net.OpError
	)
	switch {
	case err == nil || errors.Is(err, goredis.Nil):
		return err
	case errors.As(err, &serverErr):
		return driver.NotApplied(err)
	case errors.Is(err, goredis.ErrClosed), errors.Is(err, goredis.ErrPoolTimeout), errors.Is(err, goredis.ErrPoolExhausted):
		return driver.NotApplied(err)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return driver.NotApplied(err)
	}
	return err
}

// ok runs a script that returns 1 when it changed the row and 0 when its condition refused.
func (d *Driver) ok(ctx context.Context, s *goredis.Script, name string, keys []string, args ...any) (bool, error) {
	n, err := d.run(ctx, s, name, keys, args...).Int64()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// escapeGlob quotes the characters SCAN MATCH treats as a pattern, so that a key prefix is
// matched literally.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fromMicros converts server microseconds; 0 is an absent field and becomes the zero time.
func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}
