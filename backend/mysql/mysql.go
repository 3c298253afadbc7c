// Package mysql runs the fenced protocol on MySQL or MariaDB (InnoDB), through database/sql
// and github.com/go-sql-driver/mysql.
//
// Every lease operation is one autocommit statement, so each is its own transaction: it either
// commits whole or is rolled back whole. A publication writes the payload and records its
// operation id in one transaction, which runs inside a stored procedure that Migrate installs
// (fenced_publish, fenced_publish_and_release; so is the epoch bump): one round trip, so that
// a lost reply can only be lost after the server decided, and no session can write one half
// without the other. Expiry is judged by the server's clock in UTC, read once the row's lock is
// held (SYSDATE(6), see clockAfterLock in sql.go), and every time is stored as a UTC
// DATETIME(6), so no session's time_zone setting, and no client clock, ever moves an expiry.
//
// MySQL has no UPDATE ... RETURNING. An acquisition gets its new generation in the same reply
// through LAST_INSERT_ID(generation + 1), and a renewal its new expiry through
// LAST_INSERT_ID(expiry in microseconds); both are trusted only when the statement matched
// exactly one row. The epoch an acquisition stored, and its expiry, are read right after its
// statement on the same connection (see Driver.Acquire). Matched rows, not changed rows,
// decide: connections must be made with clientFoundRows=true, or a renewal that happens to
// write the expiry already stored would look refused. Migrate checks this.
//
// # Outcomes
//
// An error is marked driver.ErrNotApplied only when the statement certainly did not take
// effect: the connection could not be made, go-sql-driver returned driver.ErrBadConn (which it
// does only when it wrote nothing), or the server answered with an error, which means it
// rolled the statement (or the procedure's transaction) back. Anything else after the request
// was written, a broken connection, a timeout, or a statement killed or timed out on the server
// (which can end a procedure after its commit), may have committed and stays a plain error.
// database/sql retries only driver.ErrBadConn, so no mutation is ever sent twice.
//
// # Privileges and procedures
//
// Grant installs every operation as a SQL SECURITY DEFINER procedure and lets a role execute
// them and nothing else. A driver finds out which kind of session it has the first time it
// needs to (in Migrate, or before its first operation): it runs an UPDATE of no rows on
// fenced_resources, and if the server denies it (error 1142) it calls the procedures for every
// operation, and otherwise sends the statements themselves, which saves the CALL's extra
// result. So a store connected as a granted role needs no configuration, and a session that
// may write the tables is not slowed down. The procedures' bodies are generated from the same
// statement constants (sql.go) as the statements the driver sends, so they cannot drift apart.
//
// # Isolation
//
// The publication's transaction runs at READ COMMITTED, whatever the session's default: at
// REPEATABLE READ, InnoDB would lock the gap where the operation id would go while checking that
// it is new, and two publications with ids in one gap would deadlock on their inserts. With
// binary logging on, binlog_format must be ROW or MIXED, as READ COMMITTED requires.
package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	sqldriver "database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/tlsfiles"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Driver is the MySQL/MariaDB backend. It is safe for concurrent use by multiple goroutines.
type Driver struct {
	db    *sql.DB
	owned bool
	mode  atomic.Int32 // modeUnknown until a session has told which kind it is
}

var (
	_ driver.Driver            = (*Driver)(nil)
	_ driver.DurabilityChecker = (*Driver)(nil)
)

// New returns a driver over a handle the caller opened and keeps ownership of. The handle must
// use the go-sql-driver/mysql driver, select a database, and set clientFoundRows=true (see
// DSN), so that an UPDATE reports the rows it matched rather than the rows it changed.
//
// Nothing else in the DSN matters to correctness: parseTime and loc are irrelevant because
// times are read as integer microseconds, and time_zone is irrelevant because the clock is
// read in UTC (SYSDATE(6) less the session's offset from UTC, see clockAfterLock; the
// procedures pin the zone to UTC) and the columns are DATETIME; only a zone with daylight
// saving could shift a direct statement's reading, by the DST step, in a statement whose lock
// wait spans the change, so '+00:00' or a UTC host is best. The pool size is the caller's choice; every
// call uses one connection for one statement (two for a refused or granted acquisition).
func New(db *sql.DB) *Driver { return &Driver{db: db} }

// DSN translates a URL of the form mysql://user:password@host:port/database?param=value into
// the go-sql-driver/mysql data source name that Open uses. Query parameters are passed to
// go-sql-driver/mysql as they are (its own options, or server variables such as time_zone),
// except fenced's tls_ca, tls_cert, tls_key and tls_server_name, which become a TLS
// configuration registered under a name of its own (see customTLS); clientFoundRows is always
// set, and asking for clientFoundRows=false is an error.
// interpolateParams defaults to true: the driver then sends each statement with its arguments
// escaped in one round trip, instead of preparing it, executing it and closing it, which
// halves the latency of every operation under load. Pass interpolateParams=false to prepare.
func DSN(rawURL string) (string, error) {
	cfg, err := parseURL(rawURL)
	if err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}

// DefaultMaxIdleConns is how many idle connections the pool Open creates keeps open.
// database/sql keeps 2, so with more concurrent callers than that most calls would open a new
// connection (a TCP connect and a handshake) and close it after one statement. The number of
// open connections stays unlimited, as database/sql has it; set limits on DB() if the server's
// max_connections needs them.
const DefaultMaxIdleConns = 16

// Open connects to the database a mysql:// URL names (see DSN). Its pool keeps up to
// DefaultMaxIdleConns idle connections. The returned driver owns the pool and closes it in
// Close; New takes a handle of the caller's. "mariadb://" is accepted as a synonym.
func Open(rawURL string) (*Driver, error) {
	cfg, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("open mysql: %w", err)
	}
	db := sql.OpenDB(connectErrors{connector, cfg.Addr})
	db.SetMaxIdleConns(DefaultMaxIdleConns)
	return &Driver{db: db, owned: true}, nil
}

func parseURL(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the whole URL, password included
		}
		return nil, fmt.Errorf("parse mysql url: %w", err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return nil, fmt.Errorf("parse mysql url: scheme %q is not mysql://", u.Scheme)
	}
	q := u.Query()
	if v := q.Get("clientFoundRows"); v != "" && v != "true" {
		return nil, fmt.Errorf("parse mysql url: clientFoundRows=%s; fenced needs matched rows (true)", v)
	}
	q.Del("clientFoundRows")
	// tls=preferred uses TLS only when the server offers it, and plain text otherwise: a URL
	// that asks for TLS must never end up in plain text.
	if strings.EqualFold(q.Get("tls"), "preferred") {
		return nil, errors.New("parse mysql url: tls=preferred falls back to plain text; use tls=true (verified) or tls=skip-verify")
	}
	if err := customTLS(q); err != nil {
		return nil, err
	}
	if !q.Has("interpolateParams") {
		q.Set("interpolateParams", "true")
	}
	// The options go through go-sql-driver's own parser, so every option it knows works here.
	cfg, err := mysql.ParseDSN("/?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("parse mysql url options: %w", err)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "3306"
	}
	cfg.Net, cfg.Addr = "tcp", net.JoinHostPort(host, port)
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	if cfg.DBName = strings.TrimPrefix(u.Path, "/"); cfg.DBName == "" {
		return nil, errors.New("parse mysql url: no database named (mysql://user@host/DATABASE)")
	}
	cfg.ClientFoundRows = true
	return cfg, nil
}

// fenced's URL parameters for a CA or a client certificate of the caller's, which
// go-sql-driver reads only from a tls.Config registered under a name.
const (
	paramTLSCA         = "tls_ca"          // PEM file of the CAs that sign the server's certificate
	paramTLSCert       = "tls_cert"        // PEM file of the client certificate
	paramTLSKey        = "tls_key"         // PEM file of the client certificate's private key
	paramTLSServerName = "tls_server_name" // the name the server's certificate must carry
)

// customTLS replaces the tls_* parameters of q, if any, by tls=NAME, a configuration built
// from their files and registered with go-sql-driver under a name derived from them. They
// imply a verified TLS connection: with tls=false, skip-verify or preferred they are refused.
func customTLS(q url.Values) error {
	files := tlsfiles.Files{CA: q.Get(paramTLSCA), Cert: q.Get(paramTLSCert), Key: q.Get(paramTLSKey), ServerName: q.Get(paramTLSServerName)}
	if files == (tlsfiles.Files{}) {
		return nil
	}
	if v := q.Get("tls"); v != "" && !strings.EqualFold(v, "true") {
		return fmt.Errorf("parse mysql url: tls=%s with tls_ca, tls_cert or tls_key; these verify the server: leave tls out or set tls=true", v)
	}
	cfg, err := tlsfiles.Config(files, tlsfiles.Params{CA: paramTLSCA, Cert: paramTLSCert, Key: paramTLSKey})
	if err != nil {
		return fmt.Errorf("parse mysql url: %w", err)
	}
	sum := sha256.Sum256([]byte(files.CA + "\x00" + files.Cert + "\x00" + files.Key + "\x00" + files.ServerName))
	name := "fenced-" + hex.EncodeToString(sum[:8])
	if err := mysql.RegisterTLSConfig(name, cfg); err != nil {
		return fmt.Errorf("parse mysql url: register the TLS configuration: %w", err)
	}
	for _, k := range []string{paramTLSCA, paramTLSCert, paramTLSKey, paramTLSServerName} {
		q.Del(k)
	}
	q.Set("tls", name)
	return nil
}

// DB returns the underlying handle.
func (d *Driver) DB() *sql.DB { return d.db }

// Close closes the pool if Open created it.
func (d *Driver) Close() error {
	if d.owned {
		return d.db.Close()
	}
	return nil
}

func (d *Driver) Provision(ctx context.Context, resource string) error {
	_, _, err := d.mutate(ctx, sqlProvision, &params{resource: resource})
	return err
}

// Acquire runs the conditional UPDATE, which hands back the new generation in its reply and
// leaves the epoch it stored in a session variable, then reads the row on the same connection:
// for that epoch, for the expiry the server stored (informational) or, after a refusal, for
// the holder's token and expiry. When the row no longer holds this acquisition by the time it
// is read (it expired and was taken in between) the reported expiry is the read's own time, by
// which the lease had ended. When that read fails, the acquisition happened but its epoch is
// unknown, and the error says so (an unknown outcome).
func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	procs, err := d.procedures(ctx)
	if err != nil {
		return driver.Grant{}, driver.NotApplied(err)
	}
	p := &params{resource: resource, owner: owner, ttl: ttl.Microseconds()}
	for attempt := 1; ; attempt++ {
		g, err := d.acquire(ctx, procs, p)
		if err != nil && attempt < retryAttempts && retryable(err, ctx) {
			continue
		}
		return g, err
	}
}

func (d *Driver) acquire(ctx context.Context, procs bool, p *params) (driver.Grant, error) {
	// One connection for both statements: the session variable lives in its session.
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return driver.Grant{}, driver.NotApplied(err) // no statement was sent
	}
	defer conn.Close()
	matched, gen, err := run(ctx, conn, procs, sqlAcquire, p)
	if err != nil {
		if errors.Is(err, sqldriver.ErrBadConn) {
			// A pinned connection is not retried by database/sql; Acquire takes another.
			_ = conn.Raw(func(any) error { return sqldriver.ErrBadConn })
		}
		return driver.Grant{}, classify(err)
	}
	ok, err := oneRow(matched)
	if err != nil {
		return driver.Grant{}, err
	}
	var (
		epoch, rowGen, now int64
		rowOwner           sql.NullString
		until, acquired    sql.NullInt64
	)
	found, rerr := query(ctx, conn, procs, sqlReadLease, p, &epoch, &rowGen, &rowOwner, &until, &now, &acquired)
	if !ok {
		switch {
		case rerr != nil:
			return driver.Grant{}, driver.NotApplied(fmt.Errorf("read the holder of a busy lease: %w", rerr))
		case !found:
			return driver.Grant{}, driver.ErrNotFound
		}
		return driver.Grant{}, &driver.BusyError{Epoch: epoch, Generation: rowGen, LeaseUntil: fromNullMicros(until)}
	}
	if gen < 1 {
		return driver.Grant{}, fmt.Errorf("read acquired generation (%d): the acquisition happened", gen)
	}
	if rerr != nil || !found || !acquired.Valid {
		return driver.Grant{}, fmt.Errorf("read the epoch of acquired generation %d (found %t): the acquisition happened: %v",
			gen, found, rerr)
	}
	grant := driver.Grant{Epoch: acquired.Int64, Generation: gen, LeaseUntil: fromMicros(now)}
	if rowGen == gen && rowOwner.String == p.owner && until.Valid {
		grant.LeaseUntil = fromMicros(until.Int64)
	}
	return grant, nil
}

// Renew returns the expiry it stored, which comes back in the statement's reply (see sqlRenew).
func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	p := leaseParams(l)
	p.ttl = ttl.Microseconds()
	matched, until, err := d.mutate(ctx, sqlRenew, p)
	if err != nil {
		return time.Time{}, false, err
	}
	if ok, err := oneRow(matched); !ok || err != nil {
		return time.Time{}, false, err
	}
	return fromMicros(until), true, nil
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, sqlPublish, l, pub)
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	return d.publish(ctx, sqlPublishAndRelease, l, pub)
}

// publish calls the publication's procedure: the conditional UPDATE and, when it matched, the
// record of the operation id as accepted, in one transaction. A duplicate key on that record
// means a concurrent Resolve recorded the id first; the transaction was rolled back, and the
// publication is refused like any other whose id is known.
func (d *Driver) publish(ctx context.Context, s *stmt, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	p := leaseParams(l)
	p.payload, p.sourceVersion, p.opID = pub.Payload, pub.SourceVersion, pub.OpID
	matched, _, err := d.mutate(ctx, s, p)
	if serverError(err) == erDupEntry {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return oneRow(matched)
}

func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	matched, _, err := d.mutate(ctx, sqlRelease, leaseParams(l))
	if err != nil {
		return false, err
	}
	return oneRow(matched)
}

func leaseParams(l driver.LeaseRef) *params {
	return &params{resource: l.Resource, owner: l.Owner, generation: l.Generation, epoch: l.Epoch}
}

func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	procs, err := d.procedures(ctx)
	if err != nil {
		return driver.State{}, err
	}
	var (
		st                 = driver.State{Resource: resource}
		owner              sql.NullString
		until, publishedAt sql.NullInt64
		now                int64
	)
	found, err := query(ctx, d.db, procs, sqlRead, &params{resource: resource}, &st.Epoch, &st.Generation, &owner,
		&until, &st.PublishedEpoch, &st.PublishedGeneration, &publishedAt, &st.SourceVersion, &st.PayloadSize,
		&st.CurrentEpoch, &now)
	if err != nil {
		return driver.State{}, err
	}
	if !found {
		return driver.State{}, driver.ErrNotFound
	}
	st.Owner = owner.String
	st.LeaseUntil = fromNullMicros(until)
	st.PublishedAt = fromNullMicros(publishedAt)
	st.Now = fromMicros(now)
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	procs, err := d.procedures(ctx)
	if err != nil {
		return nil, 0, err
	}
	var (
		gen     int64
		payload []byte
	)
	found, err := query(ctx, d.db, procs, sqlReadPayload, &params{resource: resource}, &gen, &payload)
	if err != nil {
		return nil, 0, err
	}
	if !found {
		return nil, 0, driver.ErrNotFound
	}
	return payload, gen, nil
}

// ResolveOperation records the id as aborted unless it has a record, then reads the record in
// a second statement. That is race-free: the first statement has committed a record for the
// id (its own, or one that was there) before the second starts, and a record is never changed
// once written (a publication's INSERT of an id that exists fails, and its transaction rolls
// back), so the read, a fresh snapshot taken after that commit, sees the final outcome. A
// publication with the same id that was in flight either committed before the INSERT (which
// then waited for it on the key's lock and found its record) or will fail on the key.
func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	if _, _, err := d.mutate(ctx, sqlResolve, &params{opID: opID}); err != nil {
		return driver.Operation{OpID: opID}, err
	}
	op, err := d.ReadOperation(ctx, opID)
	if err == nil && op.Outcome == "" {
		// Only PruneOperations deletes records; it ran between the two statements.
		return op, fmt.Errorf("read operation %q: its record was pruned as soon as it was written", opID)
	}
	return op, err
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	procs, err := d.procedures(ctx)
	if err != nil {
		return driver.Operation{OpID: opID}, err
	}
	var (
		op                 = driver.Operation{OpID: opID}
		resource           sql.NullString
		epoch, gen, atUsec sql.NullInt64
	)
	found, err := query(ctx, d.db, procs, sqlReadOperation, &params{opID: opID}, &op.Outcome, &resource, &epoch, &gen, &atUsec)
	if err != nil || !found {
		return driver.Operation{OpID: opID}, err
	}
	op.Resource, op.Epoch, op.Generation = resource.String, epoch.Int64, gen.Int64
	op.RecordedAt = fromNullMicros(atUsec)
	return op, nil
}

// BumpEpoch calls the procedure that advances the epoch and frees every lease in one
// transaction. Against a concurrent acquisition, see currentEpoch in sql.go.
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	matched, epoch, err := d.mutate(ctx, sqlBumpEpoch, &params{})
	if err != nil {
		return 0, err
	}
	if matched != 1 || epoch < 1 {
		return 0, fmt.Errorf("fenced_meta has no epoch row (matched %d); run Migrate", matched)
	}
	return epoch, nil
}

func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	deleted, _, err := d.mutate(ctx, sqlPrune, &params{age: age.Microseconds()})
	return deleted, err
}

// CheckDurability warns about server settings under which a commit that was acknowledged can
// be lost in a crash: InnoDB's redo log not flushed at each commit, a binary log not synced at
// each commit (a crash can then lose commits the binary log, and so every replica, never saw),
// and a fenced table on an engine other than InnoDB. It also reports a server started with
// --sysdate-is-now, which no variable shows: SYSDATE() then reads the clock when the statement
// starts, like NOW(), and a renewal or a publication that waited on a row lock past the
// lease's expiry would be accepted (see clockAfterLock). When the server cannot be reached it
// says so as its warning, so that a store can still be made (and fail on its first operation).
func (d *Driver) CheckDurability(ctx context.Context) ([]string, error) {
	procs, err := d.procedures(ctx)
	if err == nil {
		var s durabilitySettings
		err = d.db.QueryRowContext(ctx, `SELECT @@global.innodb_flush_log_at_trx_commit, @@global.log_bin,
    @@global.sync_binlog`).Scan(&s.flushLogAtTrxCommit, &s.logBin, &s.syncBinlog)
		if err == nil {
			s.engines, err = d.tableEngines(ctx, procs)
		}
		var sysdateIsNow bool
		if err == nil {
			err = d.db.QueryRowContext(ctx, sqlSysdateIsNow).Scan(&sysdateIsNow)
		}
		if err == nil {
			out := s.warnings()
			if sysdateIsNow {
				out = append(out, warnSysdateIsNow)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("read durability settings: %w", err)
}

func (d *Driver) tableEngines(ctx context.Context, procs bool) (map[string]string, error) {
	text, args := sqlTableEngines.sql, []any(nil)
	if procs {
		text = sqlTableEngines.call()
	}
	rows, err := d.db.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	engines := map[string]string{}
	for rows.Next() {
		var table, engine string
		if err := rows.Scan(&table, &engine); err != nil {
			return nil, err
		}
		engines[table] = engine
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for rows.NextResultSet() {
		for rows.Next() {
		}
	}
	return engines, rows.Close()
}

// sqlSysdateIsNow is true when SYSDATE(6), called after a sleep, still reads the statement's
// start (NOW(6)): the server runs with --sysdate-is-now. AND evaluates left to right.
const sqlSysdateIsNow = `SELECT NOT (SLEEP(0.001) = 0 AND SYSDATE(6) > NOW(6))`

const warnSysdateIsNow = "the server runs with --sysdate-is-now: SYSDATE() reads the clock when a statement starts, " +
	"so a renewal or a publication that waits on a row lock past the lease's expiry is accepted; restart it without that option"

type durabilitySettings struct {
	flushLogAtTrxCommit, logBin, syncBinlog int64
	engines                                 map[string]string
}

func (s durabilitySettings) warnings() []string {
	var out []string
	if s.flushLogAtTrxCommit != 1 {
		out = append(out, fmt.Sprintf("innodb_flush_log_at_trx_commit is %d, not 1: a crash can lose commits of the last second",
			s.flushLogAtTrxCommit))
	}
	if s.logBin != 0 && s.syncBinlog != 1 {
		out = append(out, fmt.Sprintf("sync_binlog is %d, not 1, with binary logging on: a crash can lose commits from the binary log and so from every replica",
			s.syncBinlog))
	}
	tables := make([]string, 0, len(s.engines))
	for t := range s.engines {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	for _, t := range tables {
		if !strings.EqualFold(s.engines[t], "InnoDB") {
			out = append(out, fmt.Sprintf("table %s uses the %s engine, not InnoDB: its writes are not transactional or crash-safe",
				t, s.engines[t]))
		}
	}
	return out
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func fromNullMicros(us sql.NullInt64) time.Time {
	if !us.Valid {
		return time.Time{}
	}
	return fromMicros(us.Int64)
}
