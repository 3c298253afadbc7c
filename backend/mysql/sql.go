package mysql

import (
	"regexp"
	"strings"
)

// Every statement fenced runs is written once, below, with named placeholders (:resource). The
// driver sends it either directly, with the names turned into positional ? placeholders, or,
// for a session that may not write the tables, as a CALL of a stored procedure whose body is
// the same text with the names turned into procedure parameters (see procedures.go). So the
// fence is stated in one place whichever way a session reaches it.
//
// The engine's clock is UTC, never NOW() or CURRENT_TIMESTAMP alone, whose value depends on
// the session's time_zone. UTC_TIMESTAMP(6), like NOW(6), is read once, when the statement
// starts, which is before any row lock wait: InnoDB waits up to innodb_lock_wait_timeout (50 s
// by default) for another transaction's row lock, and a renewal or a publication that judged
// expiry with that reading would act on a lease that ran out while it waited. The statements
// that must not act on an expired lease judge it with clockAfterLock instead, which calls
// SYSDATE(6) when the row is evaluated: InnoDB hands the row to the server only once it holds
// the row's lock (with a semi-consistent read under READ COMMITTED the condition is evaluated
// once more after the lock is granted), so the reading is taken with the lock held
// (TestConformance/RowLockAcrossExpiry holds the lock across an expiry).
//
// Times are read back as integer microseconds since 1970-01-01 00:00:00 (TIMESTAMPDIFF against
// a DATETIME literal, which no time zone converts), so neither the session's time_zone nor the
// connection's parseTime and loc settings can change what is read.

const (
	unixEpoch = `TIMESTAMP'1970-01-01 00:00:00'`
	// nowMicros is the engine's clock in microseconds since the Unix epoch. It is
	// clockAfterLockMicros, not UTC_TIMESTAMP(6): any session may SET timestamp = N, which moves
	// NOW() and UTC_TIMESTAMP() (inside a SQL SECURITY DEFINER procedure too) but not SYSDATE().
	// So no procedure takes a time the caller chose: not a record's recorded_at, which Prune
	// judges, not Prune's cutoff, not the clock a bumped epoch is taken from (invariant 15;
	// TestForgedSessionTimestampIgnored).
	nowMicros = clockAfterLockMicros

	// clockAfterLock is the engine's UTC clock when it is called. SYSDATE(6) is the session's
	// local time at the call; NOW(6) - UTC_TIMESTAMP(6) (both read at the statement's start)
	// is the session zone's offset from UTC at the instant NOW() stands for, and takes it back
	// to UTC. Every procedure runs its statements with the session's zone pinned to '+00:00'
	// (utcZone in procedures.go), where that difference is zero whatever timestamp the session
	// set, so there the clock is SYSDATE(6) alone: a zone whose offset at a forged instant
	// differs from its offset now cannot move it (TestForgedZoneOffsetIgnored). A statement the
	// driver sends directly runs in the session's own zone, on a session that may write the
	// tables anyway: a change of that zone's offset (daylight saving) during a lock wait, or a
	// timestamp the session set, would shift its reading, and '+00:00' or 'SYSTEM' on a UTC
	// host have neither. A server started with --sysdate-is-now makes SYSDATE() NOW():
	// CheckDurability reports it.
	clockAfterLock = `(SYSDATE(6) - INTERVAL TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), NOW(6)) MICROSECOND)`
	// clockAfterLockMicros is clockAfterLock in microseconds since the Unix epoch.
	clockAfterLockMicros = `TIMESTAMPDIFF(MICROSECOND, ` + unixEpoch + `, ` + clockAfterLock + `)`

	// currentEpoch is the store's epoch, read with a shared lock inside the statement that uses
	// it. The lock is what orders an acquisition against BumpEpoch, which holds the row's
	// exclusive lock until it commits: an acquisition that reads the epoch first makes the bump
	// wait until it has committed (and the bump then frees its lease), and one that comes after
	// the bump waits for the bump to commit and reads the new epoch, since a locking read sees
	// the latest committed row, never an older snapshot. A plain subquery would be a
	// consistent read that could see the epoch from before a bump that committed meanwhile.
	currentEpoch = `(SELECT epoch FROM fenced_meta WHERE id = 1 LOCK IN SHARE MODE)`

	// leaseMatches is the condition every lease-carrying statement shares.
	leaseMatches = `resource = :resource AND lease_owner = :owner AND generation = :generation AND epoch = :epoch`
)

func micros(col string) string { return `TIMESTAMPDIFF(MICROSECOND, ` + unixEpoch + `, ` + col + `)` }

// Statement kinds: how a statement's result is read and how its procedure returns it.
const (
	kindExec  = iota // matched rows and LAST_INSERT_ID()
	kindQuery        // the rows it selects
	kindTx           // first, then (only when first matched one row) second, in one transaction
)

// stmt is one statement, ready to be sent directly or called as a procedure.
type stmt struct {
	name   string   // the procedure is fenced_<name>
	kind   int      // kindExec, kindQuery or kindTx
	sql    string   // with ? placeholders
	args   []string // the parameter names, in the order of the ? placeholders
	body   string   // with p_<name> parameters, for a procedure
	params []string // the procedure's parameters, each once, in order of first use

	first, second *stmt // the two statements of a kindTx
}

var placeholder = regexp.MustCompile(`:([a-z_]+)`)

func newStmt(name string, kind int, text string) *stmt {
	s := &stmt{name: name, kind: kind}
	s.sql = placeholder.ReplaceAllStringFunc(text, func(m string) string {
		s.args = append(s.args, m[1:])
		return "?"
	})
	s.body = placeholder.ReplaceAllString(text, "p_$1")
	s.params = unique(s.args)
	return s
}

// newTx pairs two statements run in one transaction; the procedure takes both's parameters.
func newTx(name string, first, second *stmt) *stmt {
	return &stmt{name: name, kind: kindTx, first: first, second: second,
		params: unique(append(append([]string(nil), first.params...), second.params...))}
}

func unique(names []string) []string {
	var out []string
	for _, n := range names {
		if !contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// paramTypes declares each parameter in the procedures.
var paramTypes = map[string]string{
	"resource":       "VARBINARY(255)",
	"owner":          "VARBINARY(128)",
	"op_id":          "VARBINARY(128)",
	"generation":     "BIGINT",
	"epoch":          "BIGINT",
	"ttl":            "BIGINT",
	"source_version": "BIGINT",
	"age":            "BIGINT",
	"payload":        "LONGBLOB",
}

// params holds every value a statement may name.
type params struct {
	resource, owner, opID                 string
	generation, epoch, ttl, sourceVersion int64
	age                                   int64
	payload                               []byte
}

func (p *params) value(name string) any {
	switch name {
	case "resource":
		return p.resource
	case "owner":
		return p.owner
	case "op_id":
		return p.opID
	case "generation":
		return p.generation
	case "epoch":
		return p.epoch
	case "ttl":
		return p.ttl
	case "source_version":
		return p.sourceVersion
	case "age":
		return p.age
	case "payload":
		if p.payload == nil {
			return []byte{} // an empty payload is an empty blob, not NULL
		}
		return p.payload
	}
	panic("mysql: statement names unknown parameter " + name)
}

func (p *params) values(names []string) []any {
	out := make([]any, len(names))
	for i, n := range names {
		out[i] = p.value(n)
	}
	return out
}

var (
	// sqlProvision inserts the row or leaves an existing one untouched. Not INSERT IGNORE: that
	// would turn every other error (a truncation, say) into a warning.
	sqlProvision = newStmt("provision", kindExec, `INSERT INTO fenced_resources (resource) VALUES (:resource)
ON DUPLICATE KEY UPDATE resource = resource`)

	// sqlAcquire: MySQL has no UPDATE ... RETURNING. The new generation comes back in the same
	// reply as the statement's last insert id, which LAST_INSERT_ID(expr) sets only for a row
	// it updated; the epoch it stored is left in a session variable, read by sqlReadLease on the
	// same connection. Both are trusted only when the statement matched one row. The session
	// can overwrite the variable between the two calls, but only to mislead itself: the epoch
	// it then presents is matched against the row's by every later statement.
	sqlAcquire = newStmt("acquire", kindExec, `UPDATE fenced_resources
SET generation = LAST_INSERT_ID(generation + 1),
    epoch = (@fenced_acquired_epoch := `+currentEpoch+`),
    lease_owner = :owner, lease_until = `+clockAfterLock+` + INTERVAL :ttl MICROSECOND
WHERE resource = :resource AND (lease_until IS NULL OR lease_until <= `+clockAfterLock+`)`)

	// sqlReadLease is the read Acquire makes after its statement, on the same connection.
	sqlReadLease = newStmt("read_lease", kindQuery, `SELECT epoch, generation, lease_owner, `+micros("lease_until")+`,
    `+nowMicros+`, @fenced_acquired_epoch
FROM fenced_resources WHERE resource = :resource`)

	// sqlRenew: the new expiry is computed once, in microseconds, handed to LAST_INSERT_ID (so
	// that it comes back in the reply) and stored from that same number: the value returned is
	// exactly the value written. A renewal that writes the value already there still matches,
	// because connections report matched rows. The clock is read once, by the comparison that
	// decides that the lease is live (after the row lock), into @fenced_renew_now (µs), and the new
	// expiry is that reading + ttl: SYSDATE(6) read again in SET would be later by however long
	// the server took in between, and the expiry returned would then put the renewal after the
	// lease's expiry although it was judged live before it (TestRenewReturnsDecidingClock).
	// Evaluated in WHERE before SET for the row; when the lease does not match, SET is not
	// evaluated and the variable is not used.
	sqlRenew = newStmt("renew", kindExec, `UPDATE fenced_resources
SET lease_until = TIMESTAMPADD(MICROSECOND, LAST_INSERT_ID(@fenced_renew_now + :ttl), `+unixEpoch+`)
WHERE `+leaseMatches+`
  AND lease_until > TIMESTAMPADD(MICROSECOND, (@fenced_renew_now := `+clockAfterLockMicros+`), `+unixEpoch+`)`)

	publishSet = `payload = :payload, published_generation = :generation, published_epoch = :epoch,
    published_at = ` + clockAfterLock + `,
    source_version = CASE WHEN :source_version > 0 THEN :source_version ELSE source_version END`
	publishWhere = leaseMatches + ` AND lease_until > ` + clockAfterLock + `
  AND published_generation < :generation AND (:source_version = 0 OR source_version <= :source_version)
  AND NOT EXISTS (SELECT 1 FROM fenced_operations WHERE op_id = :op_id)`

	// sqlRecordAccepted runs in the publication's transaction, after its UPDATE matched. A
	// record written meanwhile by a concurrent Resolve makes it fail with a duplicate key, and
	// the publication is rolled back and refused.
	sqlRecordAccepted = newStmt("record_accepted", kindExec, `INSERT INTO fenced_operations (op_id, outcome, resource, epoch, generation, recorded_at)
VALUES (:op_id, 'accepted', :resource, :epoch, :generation, `+clockAfterLock+`)`)

	sqlPublish = newTx("publish",
		newStmt("", kindExec, `UPDATE fenced_resources SET `+publishSet+` WHERE `+publishWhere),
		sqlRecordAccepted)

	sqlPublishAndRelease = newTx("publish_and_release",
		newStmt("", kindExec, `UPDATE fenced_resources SET `+publishSet+`,
    lease_owner = NULL, lease_until = NULL
WHERE `+publishWhere),
		sqlRecordAccepted)

	sqlRelease = newStmt("release", kindExec, `UPDATE fenced_resources SET lease_owner = NULL, lease_until = NULL
WHERE `+leaseMatches)

	sqlRead = newStmt("read", kindQuery, `SELECT epoch, generation, lease_owner, `+micros("lease_until")+`,
    published_epoch, published_generation, `+micros("published_at")+`, source_version,
    COALESCE(LENGTH(payload), 0), (SELECT epoch FROM fenced_meta WHERE id = 1), `+nowMicros+`
FROM fenced_resources WHERE resource = :resource`)

	sqlReadPayload = newStmt("read_payload", kindQuery, `SELECT published_generation, payload FROM fenced_resources WHERE resource = :resource`)

	// sqlResolve records the id as aborted unless a record exists; the no-op update leaves an
	// existing record as it is. It is not INSERT IGNORE, which would hide other errors.
	sqlResolve = newStmt("resolve", kindExec, `INSERT INTO fenced_operations (op_id, outcome, recorded_at)
VALUES (:op_id, 'aborted', `+clockAfterLock+`)
ON DUPLICATE KEY UPDATE op_id = op_id`)

	sqlReadOperation = newStmt("read_operation", kindQuery, `SELECT outcome, resource, epoch, generation, `+micros("recorded_at")+`
FROM fenced_operations WHERE op_id = :op_id`)

	// sqlBumpEpoch sets the epoch to max(epoch + 1, the server's clock in microseconds) (see
	// driver.Driver.BumpEpoch), hands the new one back as the last insert id, and frees every
	// lease, in one transaction. The clock is read when the statement starts, possibly before
	// it waits for a concurrent bump's row lock: the epoch can only lag the clock, never lead it.
	sqlBumpEpoch = newTx("bump_epoch",
		newStmt("", kindExec, `UPDATE fenced_meta SET epoch = LAST_INSERT_ID(GREATEST(epoch + 1, `+nowMicros+`)) WHERE id = 1`),
		newStmt("", kindExec, `UPDATE fenced_resources SET lease_owner = NULL, lease_until = NULL
WHERE lease_owner IS NOT NULL`))

	sqlPrune = newStmt("prune_operations", kindExec, `DELETE FROM fenced_operations
WHERE recorded_at < `+clockAfterLock+` - INTERVAL :age MICROSECOND`)

	// sqlSchemaVersion and sqlCheckFoundRows let Migrate check, through procedures, a schema it
	// may not change.
	sqlSchemaVersion = newStmt("schema_version", kindQuery, `SELECT COALESCE(MAX(version), 0) FROM fenced_schema_migrations`)

	// sqlCheckFoundRows writes the value already stored: it matches one row and changes none.
	sqlCheckFoundRows = newStmt("check_found_rows", kindExec, `UPDATE fenced_meta SET epoch = epoch WHERE id = 1`)

	// sqlTableEngines names the engine of each of fenced's tables.
	sqlTableEngines = newStmt("table_engines", kindQuery, `SELECT TABLE_NAME, COALESCE(ENGINE, '') FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('fenced_resources', 'fenced_meta', 'fenced_operations')`)
)

// procedureStmts are the statements installed as procedures by Grant: every operation of the
// protocol, and nothing that writes a table outside one (sqlRecordAccepted runs only inside
// the publication's procedures).
var procedureStmts = []*stmt{
	sqlProvision, sqlAcquire, sqlReadLease, sqlRenew, sqlPublish, sqlPublishAndRelease, sqlRelease,
	sqlRead, sqlReadPayload, sqlResolve, sqlReadOperation, sqlBumpEpoch, sqlPrune,
	sqlSchemaVersion, sqlCheckFoundRows, sqlTableEngines,
}

// call is the CALL statement for s's procedure.
func (s *stmt) call() string {
	return "CALL fenced_" + s.name + "(" + strings.TrimSuffix(strings.Repeat("?, ", len(s.params)), ", ") + ")"
}
