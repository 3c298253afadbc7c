package postgres

import (
	"fmt"
	"strings"

	"github.com/fenced-dev/fenced/driver"
)

// Every statement reads the clock with clock_timestamp(), the time at the moment of the call.
// now() and CURRENT_TIMESTAMP are frozen at the start of the transaction, so a statement that
// runs inside a transaction the caller opened earlier would judge expiry against a time in the
// past.
//
// That is not enough when an UPDATE waits for another transaction's row lock. Under READ
// COMMITTED PostgreSQL re-evaluates the WHERE clause and the SET list after the wait
// (EvalPlanQual) only when the other transaction updated the row and committed; when it only
// locked the row (FOR UPDATE, FOR NO KEY UPDATE) or updated it and rolled back, the values
// computed before the wait stand, clock_timestamp() included, and a renewal that waited past
// the expiry would revive the lease. So the statements that must not act on an expired lease
// (renewal, publication) run after sqlLockRow, in the same transaction: the lock statement
// waits, and the statement that decides starts, and reads the clock, with the lock held
// (lockFirst; TestConformance/RowLockAcrossExpiry holds the lock both ways).
//
// Durations arrive as microseconds ($n) and become intervals in SQL.
const ttlInterval = `* interval '1 microsecond'`

// epochClock is the server's clock in microseconds since 1970, the clock a new or bumped epoch
// is taken from (see driver.Driver.BumpEpoch). The migration that creates fenced_meta uses the
// same expression.
const epochClock = `floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`

// currentEpoch is the store's epoch, read inside the statement that uses it.
const currentEpoch = `(SELECT epoch FROM fenced_meta WHERE id = 1)`

// incarnationOK is the incarnation check in every lease-carrying statement's WHERE clause: it
// raises FNC01 unless the server's incarnation is the one recorded (fenced_incarnation_ok).
// As an uncorrelated scalar subquery it becomes an InitPlan, and a condition without columns
// becomes the one-time filter of a Result node above the scan: it is evaluated once, before
// the scan reads any row, so it raises even when no row matches and before any row changes
// (TestIncarnationCheckOncePerStatement shows the plans).
const incarnationOK = `(SELECT fenced_incarnation_ok())`

// leaseMatches is the condition every lease-carrying statement shares: $1 resource, $2 owner,
// $3 generation, $4 epoch, the store's current epoch, and the incarnation check.
//
// The row's epoch alone is not enough: an acquisition that overlapped a bump can leave a lease
// with the epoch from before it that the bump's statement did not see (its snapshot predates
// the acquisition's commit; see sqlAcquire). Comparing $4 with the store's epoch, read with
// the statement's snapshot, refuses every such token once the bump has committed. Like the
// incarnation check (which stays first) it has no columns: a one-time filter evaluated before the scan
// (TestConformance/BumpDuringBlockedAcquisition forces that schedule).
const leaseMatches = `resource = $1 AND lease_owner = $2 AND generation = $3 AND epoch = $4 AND ` + incarnationOK + ` AND $4 = ` + currentEpoch

// The server's incarnation. The system identifier changes when a cluster is rebuilt from a
// logical copy or re-initialised; the timeline changes when a standby is promoted or a
// point-in-time recovery ends. On a primary the timeline is read from the WAL insert position
// (the first 8 hex digits of its segment file name), which changes the moment promotion ends,
// before any write is accepted; pg_control_checkpoint() would only catch up at the next
// checkpoint. Both functions are executable by every role.
const (
	serverSystemIdentifier = `(SELECT system_identifier FROM pg_control_system())`
	serverTimeline         = `(CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())::bigint
    ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END)`
	recordIncarnation = `system_identifier = ` + serverSystemIdentifier + `, timeline = ` + serverTimeline
)

// sqlstateIncarnation is raised by fenced_incarnation_ok: a custom SQLSTATE that no server
// error uses.
const sqlstateIncarnation = "FNC01"

const (
	// sqlLockRow takes the row lock an UPDATE of the lease takes, waiting for any holder. It
	// changes nothing; its only effect is that the statement after it, in the same
	// transaction, cannot wait on the row any more.
	sqlLockRow = `SELECT FROM fenced_resources WHERE resource = $1 FOR NO KEY UPDATE`

	sqlProvision = `INSERT INTO fenced_resources (resource) VALUES ($1) ON CONFLICT (resource) DO NOTHING`

	// sqlAcquire makes its decision in the UPDATE's WHERE clause and, in the same round trip,
	// reports why it refused: when the UPDATE changed nothing, the second branch returns the row
	// as the statement's snapshot shows it (no row at all: not provisioned). The snapshot is
	// taken when the statement starts; if the UPDATE then waited on a concurrent acquisition and
	// lost on the re-check, the snapshot still shows the lease free. seen_free says so, and the
	// driver reads the row again in that case only.
	//
	// The store's epoch is read with FOR SHARE, in a CTE that the WHERE clause's one-time
	// filter evaluates before the scan reaches the resource's row: a bump (which updates
	// fenced_meta) cannot commit while the acquisition holds that lock, and an acquisition that
	// starts while a bump is in progress waits for it and then, under READ COMMITTED, locks and
	// reads the bumped epoch (under REPEATABLE READ and SERIALIZABLE it fails with a
	// serialization failure, and the driver runs it again). Read without the lock, the epoch
	// came from the statement's snapshot: an acquisition that waited on the resource's row while
	// a bump committed got the epoch from before the bump, after it was acknowledged. Both lock
	// fenced_meta before any resource row (the bump's UPDATE of fenced_meta runs before its
	// data-modifying CTE), so the two cannot deadlock. An acquisition that commits first still
	// keeps the old epoch, and the bump, whose snapshot predates that commit, does not free its
	// lease: leaseMatches then refuses the lease's token, and a lease whose epoch is older than
	// the store's counts as free here.
	//
	// It does not take the row lock first (see sqlLockRow): a clock read before a lock wait
	// can only refuse a lease that ran out during the wait (busy; the caller tries again) or
	// store an expiry earlier than the end of the wait plus the TTL, both on the safe side.
	sqlAcquire = `WITH meta AS MATERIALIZED (
    SELECT epoch FROM fenced_meta WHERE id = 1 FOR SHARE
), acquired AS (
    UPDATE fenced_resources
    SET generation = generation + 1, epoch = (SELECT epoch FROM meta), lease_owner = $2,
        lease_until = clock_timestamp() + $3::bigint ` + ttlInterval + `
    WHERE resource = $1 AND ` + incarnationOK + ` AND (SELECT epoch FROM meta) IS NOT NULL
      AND (lease_until IS NULL OR lease_until <= clock_timestamp() OR epoch < (SELECT epoch FROM meta))
    RETURNING epoch, generation, lease_until
)
SELECT true, epoch, generation, lease_until, false FROM acquired
UNION ALL
SELECT false, epoch, generation, lease_until,
    (lease_until IS NULL OR lease_until <= clock_timestamp() OR epoch < (SELECT epoch FROM meta))
FROM fenced_resources
WHERE resource = $1 AND NOT EXISTS (SELECT FROM acquired)`

	sqlRenew = `UPDATE fenced_resources
SET lease_until = clock_timestamp() + $5::bigint ` + ttlInterval + `
WHERE ` + leaseMatches + ` AND lease_until > clock_timestamp()
RETURNING lease_until`

	// publishSet and publishWhere: $5 payload, $6 source version (0: none), $7 operation id.
	publishSet = `payload = $5, published_generation = $3, published_epoch = $4, published_at = clock_timestamp(),
        source_version = CASE WHEN $6::bigint > 0 THEN $6::bigint ELSE source_version END`
	publishWhere = leaseMatches + ` AND lease_until > clock_timestamp()
      AND published_generation < $3 AND ($6::bigint = 0 OR source_version <= $6::bigint)
      AND NOT EXISTS (SELECT 1 FROM fenced_operations WHERE op_id = $7)`

	// recordAccepted completes a publication: the UPDATE above, in a CTE, and the record of its
	// operation id are one statement, so both happen or neither does. Its row count (1 or 0)
	// is the publication's. A Resolve that records the same id concurrently, after this
	// statement's snapshot, makes the INSERT fail with unique_violation (or, under
	// SERIALIZABLE, a serialization failure) and rolls the UPDATE back with it: refused.
	recordAccepted = `)
INSERT INTO fenced_operations (op_id, outcome, resource, epoch, generation, recorded_at)
SELECT $7, 'accepted', resource, epoch, generation, clock_timestamp() FROM published`

	sqlPublish = `WITH published AS (
    UPDATE fenced_resources SET ` + publishSet + `
    WHERE ` + publishWhere + `
    RETURNING resource, epoch, generation
` + recordAccepted

	sqlPublishAndRelease = `WITH published AS (
    UPDATE fenced_resources SET ` + publishSet + `, lease_owner = NULL, lease_until = NULL
    WHERE ` + publishWhere + `
    RETURNING resource, epoch, generation
` + recordAccepted

	sqlRelease = `UPDATE fenced_resources
SET lease_owner = NULL, lease_until = NULL
WHERE ` + leaseMatches

	// sqlRead reports no lease when the row's epoch is older than the store's: a lease that
	// an acquisition committed while a bump was waiting for it (see sqlAcquire) is free from
	// the bump on, as if the bump had cleared it, which is how leaseMatches and sqlAcquire
	// treat it too.
	sqlRead = `SELECT epoch, generation, CASE WHEN epoch >= m.current THEN lease_owner END,
    CASE WHEN epoch >= m.current THEN lease_until END, published_epoch, published_generation,
    published_at, source_version, coalesce(octet_length(payload), 0)::bigint, m.current, clock_timestamp()
FROM fenced_resources, (SELECT ` + currentEpoch + ` AS current) m WHERE resource = $1`

	sqlReadPayload = `SELECT published_generation, payload FROM fenced_resources WHERE resource = $1`

	// sqlRecordAborted and sqlReadOperation are Resolve's two statements. They must be two:
	// under READ COMMITTED, when the INSERT waits for a concurrent publication that inserts
	// the same id and then commits, it does nothing, and a SELECT in the same statement (a CTE
	// or RETURNING) would read with the snapshot taken before the wait and miss the committed
	// 'accepted' row. The second statement takes a new snapshot and sees it. Under REPEATABLE
	// READ and SERIALIZABLE the INSERT instead fails with a serialization failure when the
	// conflicting row is not in its snapshot; the driver runs Resolve again in a new
	// transaction, which sees the row. Any row the snapshot does see is read by the SELECT.
	sqlRecordAborted = `INSERT INTO fenced_operations (op_id, outcome, recorded_at)
VALUES ($1, 'aborted', clock_timestamp())
ON CONFLICT (op_id) DO NOTHING`

	sqlReadOperation = `SELECT outcome, resource, epoch, generation, recorded_at FROM fenced_operations WHERE op_id = $1`

	// sqlBumpEpoch frees every lease and sets the epoch to max(epoch + 1, the server's clock),
	// recording the server's current incarnation, in one statement (a data-modifying CTE always
	// runs to completion).
	sqlBumpEpoch = `WITH freed AS (
    UPDATE fenced_resources SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL
)
UPDATE fenced_meta SET epoch = greatest(epoch + 1, ` + epochClock + `), ` + recordIncarnation + ` WHERE id = 1
RETURNING epoch`

	sqlPrune = `DELETE FROM fenced_operations WHERE recorded_at < clock_timestamp() - $1::bigint ` + ttlInterval

	sqlSchemaVersion = `SELECT coalesce(max(version), 0) FROM fenced_schema_migrations`

	// sqlRecordIncarnation runs in every migration transaction; it fills the incarnation in
	// only where none is recorded, so that running Migrate after a restore does not silently
	// accept the new incarnation: only BumpEpoch does.
	sqlRecordIncarnation = `UPDATE fenced_meta SET ` + recordIncarnation + ` WHERE id = 1 AND system_identifier IS NULL`
)

// checkIncarnationBody is the body of fenced_incarnation_ok(), which every lease-carrying
// statement calls once (incarnationOK). It returns true or raises. Both incarnations are read
// on every call: the server's from pg_control_system() and the WAL position (about 4 µs, a read
// of the control file), the recorded one from fenced_meta, which only the owner may write. It
// keeps nothing in the session: a session setting, a temporary table or anything else the
// caller's session can write would let a granted role switch the check off (invariant 15;
// TestForgedIncarnationSettingIgnored sets the setting an earlier version cached it in).
const checkIncarnationBody = `DECLARE
    server   text := ` + serverSystemIdentifier + ` || '/' || ` + serverTimeline + `;
    recorded text;
BEGIN
    SELECT system_identifier || '/' || timeline INTO recorded FROM fenced_meta WHERE id = 1;
    IF recorded IS DISTINCT FROM server THEN
        RAISE EXCEPTION 'the server''s incarnation % differs from % recorded at the last epoch bump', server, recorded
            USING ERRCODE = '` + sqlstateIncarnation + `';
    END IF;
    RETURN true;
END`

// sqlstatePrefix is raised by a routine when the resource is outside the caller's prefixes.
const sqlstatePrefix = "FNC02"

// prefixCheck begins every routine whose first argument is a resource. The caller is
// session_user, the role that logged in (a SECURITY DEFINER routine runs as its owner, so
// current_user is the owner, and only a superuser can change session_user); it may use the
// resource when a role it is a member of has a row in fenced_grants whose prefix begins the
// name (the empty prefix for every resource). fenced_grants is written only by Grant, as the owner. The
// owner itself, which may write the tables anyway, is not checked. A role granted before
// prefixes existed has no row and is refused: run Grant again.
const prefixCheck = `    IF session_user <> current_user AND NOT EXISTS (
        SELECT FROM fenced_grants g JOIN pg_catalog.pg_roles r ON r.rolname = g.role
        WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER') AND pg_catalog.starts_with($1, g.prefix)) THEN
        RAISE EXCEPTION 'role % may not use resource %: outside the prefixes it was granted', session_user, $1
            USING ERRCODE = '` + sqlstatePrefix + `';
    END IF;
`

// sqlGrantsTable holds each granted role's prefixes; Grant creates it (as the owner) and
// revokes every right on it from everyone else.
const sqlGrantsTable = `CREATE TABLE IF NOT EXISTS fenced_grants (
    role   text NOT NULL,
    prefix text NOT NULL,
    PRIMARY KEY (role, prefix)
)`

// routine is one operation as a database function. Its body is built from the statement
// constants above, so the function and the statement are the same text: a driver that may
// write the tables sends the statement, one that may not calls the function (see the package
// documentation).
type routine struct {
	name   string
	params string // argument types, in order ($1, $2, ...)
	// returns is "TABLE (...)" for a statement that returns rows, or "bigint" for one whose
	// row count is the result.
	returns string
	// before runs first (Resolve's INSERT); statement is the one whose result is returned.
	before    string
	statement string
	// lockFirst runs sqlLockRow on the resource ($1) before statement, in its transaction.
	lockFirst bool
	// granted routines are executable by a role passed to Grant whose level includes access.
	granted bool
	access  driver.Access
	// op names the operation in a refusal for lack of rights ("bump the epoch").
	op string
	// resource: $1 is a resource name, checked against the caller's prefixes (prefixCheck).
	resource bool
}

func (r routine) rows() bool { return strings.HasPrefix(r.returns, "TABLE") }

// signature names the function with its argument types, as GRANT and REVOKE need.
func (r routine) signature() string { return r.name + "(" + r.params + ")" }

// call is the statement the driver sends: one round trip.
func (r routine) call() string {
	var args []string
	if r.params != "" {
		for i := range strings.Split(r.params, ",") {
			args = append(args, fmt.Sprintf("$%d", i+1))
		}
	}
	if r.rows() {
		return "SELECT * FROM " + r.name + "(" + strings.Join(args, ", ") + ")"
	}
	return "SELECT " + r.name + "(" + strings.Join(args, ", ") + ")"
}

// body is the PL/pgSQL source: PL/pgSQL rather than SQL functions because it keeps each
// statement's plan for the session.
func (r routine) body() string {
	if r.name == rtIncarnationOK.name {
		return checkIncarnationBody
	}
	var b strings.Builder
	if !r.rows() {
		b.WriteString("DECLARE\n    n bigint;\n")
	}
	b.WriteString("BEGIN\n")
	if r.resource {
		b.WriteString(prefixCheck)
	}
	if r.lockFirst {
		b.WriteString("PERFORM" + strings.TrimPrefix(sqlLockRow, "SELECT") + ";\n")
	}
	if r.before != "" {
		b.WriteString(r.before + ";\n")
	}
	if r.rows() {
		b.WriteString("RETURN QUERY " + r.statement + ";\n")
	} else {
		b.WriteString(r.statement + ";\n    GET DIAGNOSTICS n = ROW_COUNT;\n    RETURN n;\n")
	}
	b.WriteString("END")
	return b.String()
}

// create is the DDL that installs the routine in schema, running as its owner with the search
// path fixed to that schema (and pg_temp last, so no temporary object can shadow a table).
// fenced_incarnation_ok is the exception: it runs as its caller with the caller's search path,
// which is either an operation routine (the owner, that fixed path) or, in direct mode, a
// user that may write the tables and resolves them with the same path as the statement
// calling it. Switching the user and the search path on every call costs about as much as
// the check itself.
func (r routine) create(schema string) string {
	attributes := " SECURITY DEFINER SET search_path = " + schema + ", pg_temp"
	if r.name == rtIncarnationOK.name {
		attributes = ""
	}
	return "CREATE OR REPLACE FUNCTION " + r.signature() + " RETURNS " + r.returns +
		"\nLANGUAGE plpgsql VOLATILE" + attributes + " AS $fenced$" + r.body() + "$fenced$"
}

var (
	rtIncarnationOK = routine{name: "fenced_incarnation_ok", params: "", returns: "boolean"}
	rtProvision     = routine{name: "fenced_provision", params: "text", returns: "bigint", statement: sqlProvision,
		granted: true, access: driver.AccessAdmin, op: "provision", resource: true}
	rtAcquire = routine{name: "fenced_acquire", params: "text, text, bigint",
		returns:   "TABLE (o_acquired boolean, o_epoch bigint, o_generation bigint, o_lease_until timestamptz, o_seen_free boolean)",
		statement: sqlAcquire, granted: true, access: driver.AccessWorker, op: "acquire", resource: true}
	rtRenew = routine{name: "fenced_renew", params: "text, text, bigint, bigint, bigint",
		returns: "TABLE (o_lease_until timestamptz)", statement: sqlRenew, lockFirst: true, granted: true, access: driver.AccessWorker, op: "renew", resource: true}
	rtPublish = routine{name: "fenced_publish", params: "text, text, bigint, bigint, bytea, bigint, text",
		returns: "bigint", statement: sqlPublish, lockFirst: true, granted: true, access: driver.AccessWorker, op: "publish", resource: true}
	rtPublishAndRelease = routine{name: "fenced_publish_and_release", params: "text, text, bigint, bigint, bytea, bigint, text",
		returns: "bigint", statement: sqlPublishAndRelease, lockFirst: true, granted: true, access: driver.AccessWorker, op: "publish", resource: true}
	rtRelease = routine{name: "fenced_release", params: "text, text, bigint, bigint",
		returns: "bigint", statement: sqlRelease, granted: true, access: driver.AccessWorker, op: "release", resource: true}
	rtRead = routine{name: "fenced_read", params: "text",
		returns: "TABLE (o_epoch bigint, o_generation bigint, o_lease_owner text, o_lease_until timestamptz, " +
			"o_published_epoch bigint, o_published_generation bigint, o_published_at timestamptz, " +
			"o_source_version bigint, o_payload_size bigint, o_current_epoch bigint, o_now timestamptz)",
		statement: sqlRead, granted: true, access: driver.AccessReader, op: "read", resource: true}
	rtReadPayload = routine{name: "fenced_read_payload", params: "text",
		returns: "TABLE (o_published_generation bigint, o_payload bytea)", statement: sqlReadPayload, granted: true, access: driver.AccessReader, op: "read", resource: true}
	operationColumns = "TABLE (o_outcome text, o_resource text, o_epoch bigint, o_generation bigint, o_recorded_at timestamptz)"
	rtResolve        = routine{name: "fenced_resolve", params: "text", returns: operationColumns,
		before: sqlRecordAborted, statement: sqlReadOperation, granted: true, access: driver.AccessWorker, op: "resolve an operation"}
	rtReadOperation = routine{name: "fenced_read_operation", params: "text", returns: operationColumns,
		statement: sqlReadOperation, granted: true, access: driver.AccessReader, op: "read an operation"}
	rtBumpEpoch = routine{name: "fenced_bump_epoch", params: "", returns: "TABLE (o_epoch bigint)",
		statement: sqlBumpEpoch, granted: true, access: driver.AccessAdmin, op: "bump the epoch"}
	rtPrune = routine{name: "fenced_prune", params: "bigint", returns: "bigint", statement: sqlPrune,
		granted: true, access: driver.AccessAdmin, op: "prune operation records"}
	rtSchemaVersion = routine{name: "fenced_schema_version", params: "", returns: "TABLE (o_version integer)",
		statement: sqlSchemaVersion, granted: true, access: driver.AccessReader, op: "read the schema version"}

	// routines are installed in this order (fenced_incarnation_ok before its callers).
	routines = []routine{rtIncarnationOK, rtProvision, rtAcquire, rtRenew, rtPublish, rtPublishAndRelease,
		rtRelease, rtRead, rtReadPayload, rtResolve, rtReadOperation, rtBumpEpoch, rtPrune, rtSchemaVersion}

	// retiredRoutines are the signatures of routines earlier versions installed, dropped by
	// Migrate: fenced_check_incarnation() was called by each routine before the check moved
	// into the statements.
	retiredRoutines = []string{"fenced_check_incarnation()"}

	// fencedTables are the tables a granted role may not touch directly.
	fencedTables = []string{"fenced_resources", "fenced_operations", "fenced_meta", "fenced_schema_migrations", "fenced_grants"}
)

// Migration and grant statements. The lock key is one constant for every schema: migrations
// are rare, so serializing those of unrelated schemas costs nothing worth a per-schema key.
const (
	migrateLockKey = 0x66656e636564 // "fenced"

	sqlMigrateLock = `SELECT pg_advisory_xact_lock($1)`

	sqlMigrationsTable = `CREATE TABLE IF NOT EXISTS fenced_schema_migrations (
    version    integer     NOT NULL PRIMARY KEY,
    applied_at timestamptz NOT NULL
)`

	sqlMigrationsRecord = `INSERT INTO fenced_schema_migrations (version, applied_at) VALUES ($1, clock_timestamp())`

	// sqlMayMigrate is false when the migrations table exists and this user may not write it:
	// a role that Grant gave only the routines. NULL (no table yet) means a fresh schema.
	sqlMayMigrate = `SELECT has_table_privilege(to_regclass('fenced_schema_migrations'), 'INSERT')`

	// sqlInstalledRoutines lists the bodies of the fenced routines in the schema the tables are
	// created in (the first existing schema on the search path).
	sqlInstalledRoutines = `SELECT p.proname, p.prosrc FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'fenced\_%'`

	sqlCurrentSchema = `SELECT current_schema()`

	// sqlIncarnationRecorded: Migrate records the incarnation once, when none is recorded.
	sqlIncarnationRecorded = `SELECT system_identifier IS NOT NULL FROM fenced_meta WHERE id = 1`

	// sqlReadOnly: a hot standby, or a server whose sessions default to read-only.
	sqlReadOnly = `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'`
)
