package sqlserver

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// The statements below use only SYSUTCDATETIME() for the engine's clock, never GETDATE(),
// SYSDATETIME() or CURRENT_TIMESTAMP, which follow the server's time zone and, for the first
// and last, have only DATETIME's 3 ms resolution. SQL Server evaluates SYSUTCDATETIME() once
// per statement, when the statement starts, so every comparison and assignment in one
// statement sees the same instant (also when the statement then waits on a row lock).
//
// Every time is read through TODATETIMEOFFSET(x, 0): go-mssqldb decodes a DATETIME2 in the
// location of the connection's "timezone" parameter, which would shift the instant of a UTC
// value on a handle opened with one; a DATETIMEOFFSET carries its own offset.
//
// Parameters are named (@resource, @owner, @generation, @payload, @ttl_s, @ttl_us) and passed
// with sql.Named; the functions at the end of this file build them, so the driver and the raw
// benchmark baseline send the same ones.
//
// {resources} and {migrations} stand for the bracket-quoted, schema-qualified table names;
// newStatements replaces them once per driver.

// leaseEnd is engine-now + TTL. DATEADD's number is an INT, so a TTL in microseconds would
// overflow past 2^31 µs (about 35 minutes): the TTL goes as whole seconds plus the
// microseconds left over. See splitTTL.
const leaseEnd = `DATEADD(second, @ttl_s, DATEADD(microsecond, @ttl_us, SYSUTCDATETIME()))`

// autocommit begins every protocol statement, to undo two session settings that a login
// trigger, the server's "user options" or the caller's own session can turn on. With NOCOUNT
// on, a procedure's row counts are not reported. With IMPLICIT_TRANSACTIONS on, an UPDATE (or
// a SELECT, which then leaves the connection inside a transaction for the next statement)
// would open a transaction that nobody commits, and an acknowledged change would be rolled
// back when the connection is reset. Settings made in a parameterized batch (sp_executesql) or
// in a procedure revert when it ends. SET ROWCOUNT n, which a caller's session can set and a
// procedure inherits, would stop an UPDATE or DELETE after n rows: BumpEpoch would free only
// some leases. So it is reset too.
const autocommit = "SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF; SET ROWCOUNT 0;\n"

// writes follows autocommit in every batch that changes something, so that an error reply
// proves the change did not happen (see classify). With XACT_ABORT OFF (the default) many
// run-time errors - a duplicate key, a truncation, a conversion - end only the statement: the
// batch goes on, and its COMMIT would commit what came before the error. With XACT_ABORT ON
// every run-time error ends the batch and rolls back its whole transaction, so a batch that
// does its work inside BEGIN TRANSACTION ... COMMIT either commits all of it or, when SQL
// Server reports an error, none of it. The isolation level is pinned so that the locking
// hints below mean what their comments say whatever the session was left at (SNAPSHOT would
// read versions instead).
const writes = "SET XACT_ABORT ON; SET TRANSACTION ISOLATION LEVEL READ COMMITTED;\n"

// currentEpoch is the store's epoch, read inside the acquiring statement. HOLDLOCK makes it a
// locking read that keeps its shared lock on the fenced_meta row until the acquisition
// commits, also when the database reads committed versions (READ_COMMITTED_SNAPSHOT) - a
// versioned read could return the epoch a concurrent BumpEpoch is replacing. BumpEpoch
// updates fenced_meta first, holding its exclusive lock to its commit, and then frees every
// held lease. So either the acquisition reads fenced_meta first and BumpEpoch waits for it to
// commit, then frees the lease it installed; or BumpEpoch updates fenced_meta first and the
// acquisition waits for the bump to commit and reads the new epoch. (If each holds the lock
// the other needs, SQL Server ends one as a deadlock victim and rolls it back; see retry.)
const currentEpoch = `(SELECT epoch FROM {meta} WITH (HOLDLOCK) WHERE id = 1)`

// clockEpoch is the engine's clock in microseconds since 1970 (DATEDIFF_BIG, SQL Server 2016
// and later), the floor of every epoch a store sets: a store that lost everything and starts
// again from its migrations still issues tokens greater than every one it issued before,
// provided the server's clock did not go back across the loss (if it did, by as much as it
// went back; bump the epoch by hand after such a loss). The literal is in the unseparated
// form, which SQL Server reads the same way under every language and DATEFORMAT setting.
const clockEpoch = `DATEDIFF_BIG(microsecond, CAST('19700101' AS DATETIME2(7)), SYSUTCDATETIME())`

// The database's incarnation, as SQL Server reports it for the current database in
// sys.database_recovery_status
// (https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-database-recovery-status-transact-sql):
// database_guid changes when the database is restored under a name that does not exist yet
// (or attached from copied files); recovery_fork_guid changes when a restore recovers the
// database at a point other than the end of its log - a full backup recovered without its
// log, a point-in-time restore - which starts a new recovery path
// (https://learn.microsoft.com/sql/relational-databases/backup-restore/recovery-paths).
// Visibility: a login sees the current database's row when it owns the database or holds
// VIEW ANY DATABASE (granted to public by default) or ALTER ANY DATABASE; ownership chaining
// does not extend to a catalog view's row filter, so a granted role's login needs the same.
const (
	serverIncarnation = `FROM sys.database_recovery_status WHERE database_id = DB_ID()`
	serverForkGUID    = `(SELECT recovery_fork_guid ` + serverIncarnation + `)`
	serverDBGUID      = `(SELECT database_guid ` + serverIncarnation + `)`
	recordIncarnation = `recovery_fork_guid = ` + serverForkGUID + `, database_guid = ` + serverDBGUID
)

// Error numbers fenced's own statements THROW (user errors are 50000 and above). Both are
// raised before the statement changes anything, and THROW ends the batch.
const (
	errIncarnationChanged = 51801 // the recorded incarnation is not the database's
	errIncarnationHidden  = 51802 // this login cannot read sys.database_recovery_status
	errOutsidePrefixes    = 51803 // the resource is outside the caller's prefixes (prefixCheck)
)

// incarnationVisible fails (51802) when the login cannot see its database's incarnation, so
// that an invisible row is reported as a missing permission, not as a restore.
const incarnationVisible = `IF ` + serverForkGUID + ` IS NULL OR ` + serverDBGUID + ` IS NULL
    THROW 51802, N'fenced: this login cannot read its database''s row in sys.database_recovery_status; grant it VIEW ANY DATABASE', 1;
`

// incarnationOK begins every lease-carrying batch: it fails (51801) unless the incarnation
// recorded at the last Migrate or BumpEpoch is the database's, before anything is locked or
// changed. After a restore, no lease issued in the lost history can be used and none is issued
// under the old epoch until BumpEpoch records the new incarnation.
const incarnationOK = incarnationVisible + `IF NOT EXISTS (SELECT 1 FROM {meta} WHERE id = 1
    AND recovery_fork_guid = ` + serverForkGUID + ` AND database_guid = ` + serverDBGUID + `)
    THROW 51801, N'fenced: the database was restored since the last epoch bump; bump the epoch', 1;
`

// prefixCheck follows the session settings of every procedure that takes a resource
// (withPrefixCheck): it fails (51803) before anything is read or locked when the caller is
// limited to prefixes (fenced grant --prefix) and the resource begins with none of them.
//
// Who the caller is: the procedures have no EXECUTE AS clause, so they run as CALLER, the
// default for procedures: the statements inside execute in the security context of the
// database user who called the procedure, and ownership chaining only skips the permission
// checks on the tables they reference
// (https://learn.microsoft.com/sql/t-sql/statements/execute-as-clause-transact-sql). IS_MEMBER
// therefore answers for the caller, role membership included (nested roles and Windows or
// Entra groups too) (https://learn.microsoft.com/sql/t-sql/functions/is-member-transact-sql).
// Were the procedures ever given EXECUTE AS OWNER, IS_MEMBER and USER_NAME() would answer for
// the owner and this check would have to change (ORIGINAL_LOGIN() names the login, not the
// database roles). Nothing the caller's session can set is consulted: not CONTEXT_INFO, not
// SESSION_CONTEXT, not a temporary table (the table name is schema-qualified, which a #table
// cannot shadow). Switching to another user takes EXECUTE AS USER, which needs IMPERSONATE on
// that user: a caller that holds it has that user's rights anyway.
//
// The rule, the same as on PostgreSQL and MariaDB: a caller that is a member of no role with
// rows in fenced_grants (the tables' owner; a role granted before prefixes existed on SQL
// Server, which was unlimited) is not checked; otherwise the resource must begin with a prefix
// of one of its roles (the empty prefix, which Grant writes for a role granted without
// --prefix, begins every name). Members of db_owner are not checked: the DENYs do not bind
// them, they could change the tables directly.
//
// The match compares bytes, never LIKE (which would read %, _ and [ in a prefix as
// wildcards) and never = on the strings (which ignores trailing spaces, so that 'a' would
// equal 'a ', and follows the collation's case rules): the UTF-16 bytes of the resource's
// first DATALENGTH(prefix) bytes against the prefix's bytes, with the resource at least as
// long (LEN would not count the prefix's trailing spaces, and VARBINARY comparison pads the
// shorter value with zeros).
const prefixCheck = `IF IS_MEMBER(N'db_owner') = 0
    AND EXISTS (SELECT 1 FROM {grants} WHERE IS_MEMBER(role_name) = 1)
    AND NOT EXISTS (SELECT 1 FROM {grants} WHERE IS_MEMBER(role_name) = 1
        AND DATALENGTH(@resource) >= DATALENGTH(prefix)
        AND SUBSTRING(CAST(@resource AS VARBINARY(8000)), 1, DATALENGTH(prefix)) = CAST(prefix AS VARBINARY(510)))
BEGIN
    DECLARE @outside NVARCHAR(2048) = CONCAT(N'fenced: role ', USER_NAME(), N' may not use resource ', @resource,
        N': it is outside the prefixes the role was granted');
    THROW 51803, @outside, 1;
END;
`

// withPrefixCheck puts prefixCheck into a resource operation's batch right after the session
// settings (autocommit, and writes where the batch has it), so that its reads open no implicit
// transaction and no ROWCOUNT applies to them.
func withPrefixCheck(text string) string {
	head := autocommit
	if strings.HasPrefix(text, autocommit+writes) {
		head = autocommit + writes
	}
	if !strings.HasPrefix(text, head) {
		panic("sqlserver: a resource operation's batch does not begin with the session settings")
	}
	return head + prefixCheck + text[len(head):]
}

// leaseMatches is the condition every lease-carrying statement shares.
const leaseMatches = `resource = @resource AND lease_owner = @owner AND generation = @generation AND epoch = @epoch`

// lockRow opens the batch's transaction and takes an update lock on the resource's row,
// waiting for whoever holds it (a BumpEpoch, a caller's transaction). The statement after it
// reads SYSUTCDATETIME() when it starts, which is then after the wait: SQL Server evaluates
// that function once per statement, not once per row or per lock wait, so a conditional
// UPDATE that waited itself would judge expiry by the instant before its wait
// (https://learn.microsoft.com/sql/t-sql/functions/sysutcdatetime-transact-sql). The update
// lock is held to the end of the transaction and conflicts with every other update lock, so
// nobody changes the row between this read and the UPDATE. ROWLOCK keeps the lock on the one
// row. The assignment returns no result set.
const lockRow = `DECLARE @locked INT;
BEGIN TRANSACTION;
SELECT @locked = 1 FROM {resources} WITH (UPDLOCK, ROWLOCK) WHERE resource = @resource;
`

// operationAbsent sets @absent to 0 when the operation id has a recorded outcome. UPDLOCK with
// HOLDLOCK takes a key-range update lock on the id even when no row has it, held to the end of
// the transaction, so a publication and a Resolve (or two publications) carrying one id run
// one after another: the second sees the first's record. The range lock also covers ids next
// to this one in the index: publications whose ids fall in one key range (on an empty table,
// all of them) wait for each other at this statement. It runs before the clock is read, so
// that wait too ends before expiry is judged.
const operationAbsent = `DECLARE @absent INT = 1;
SELECT @absent = 0 FROM {operations} WITH (UPDLOCK, HOLDLOCK) WHERE op_id = @op_id;
`

const (
	// tmplProvision (resource) inserts the row unless it exists. Without the hints, two
	// sessions could both find no row under READ COMMITTED (no lock is held on a key that is
	// not there) and both insert, the second failing on the primary key. UPDLOCK with HOLDLOCK
	// takes a key-range update lock for the missing key, so the second session waits for the
	// first to commit and then sees its row. (HOLDLOCK alone would take shared range locks that
	// both sessions get, and then deadlock on the insert.) A duplicate-key error is still
	// treated as success, for callers whose session isolation changes the hints' effect.
	tmplProvision = autocommit + writes + `INSERT INTO {resources} (resource)
SELECT @resource
WHERE NOT EXISTS (SELECT 1 FROM {resources} WITH (UPDLOCK, HOLDLOCK) WHERE resource = @resource)`

	// tmplAcquireUpdate (resource, owner, ttl_s, ttl_us) is the acquisition itself (the raw
	// benchmark baseline runs it alone). Its OUTPUT row carries acquired = 1.
	tmplAcquireUpdate = `UPDATE {resources}
SET generation = generation + 1, epoch = ` + currentEpoch + `,
    lease_owner = @owner, lease_until = ` + leaseEnd + `
OUTPUT inserted.epoch, inserted.generation, TODATETIMEOFFSET(inserted.lease_until, 0), 1 AS acquired
WHERE resource = @resource AND (lease_until IS NULL OR lease_until <= SYSUTCDATETIME())`

	// tmplAcquire locks the row (lockRow), runs the acquisition and, in the same round trip and
	// only when it matched no row, reads the holder (acquired = 0) to say why. The read decides
	// nothing: the refusal was the UPDATE's. No row at all means the resource is not
	// provisioned. Everything is in one transaction under XACT_ABORT, and the answer is read
	// before the COMMIT.
	tmplAcquire = autocommit + writes + incarnationOK + lockRow + tmplAcquireUpdate + `;
IF @@ROWCOUNT = 0
    SELECT epoch, generation, TODATETIMEOFFSET(lease_until, 0), 0 AS acquired FROM {resources} WHERE resource = @resource;
COMMIT TRANSACTION;`

	// tmplRenew (resource, owner, generation, epoch, ttl_s, ttl_us) judges expiry after the row
	// lock is held (lockRow): a renewal never revives a lease that expired while it waited.
	tmplRenew = autocommit + writes + incarnationOK + lockRow + `UPDATE {resources}
SET lease_until = ` + leaseEnd + `
OUTPUT TODATETIMEOFFSET(inserted.lease_until, 0)
WHERE ` + leaseMatches + ` AND lease_until > SYSUTCDATETIME();
COMMIT TRANSACTION;`

	// publishSet and publishWhere: the publication's own parameters are payload,
	// source_version (0: none) and op_id.
	publishSet = `payload = @payload, published_generation = @generation, published_epoch = @epoch,
    published_at = SYSUTCDATETIME(),
    source_version = CASE WHEN @source_version > 0 THEN @source_version ELSE source_version END`
	publishWhere = leaseMatches + ` AND lease_until > SYSUTCDATETIME()
  AND published_generation < @generation AND (@source_version = 0 OR source_version <= @source_version)
  AND @absent = 1`

	// tmplPublishUpdate and tmplPublishAndReleaseUpdate are the conditional UPDATEs that
	// tmplPublish and tmplPublishAndRelease wrap.
	tmplPublishUpdate           = `UPDATE {resources} SET ` + publishSet + ` WHERE ` + publishWhere
	tmplPublishAndReleaseUpdate = `UPDATE {resources} SET ` + publishSet + `,
    lease_owner = NULL, lease_until = NULL
WHERE ` + publishWhere

	// tmplPublish and tmplPublishAndRelease (resource, owner, generation, epoch, payload,
	// source_version, op_id) lock the row, then the operation id, then store the publication
	// and record the id as accepted, in one transaction; they answer how many rows were
	// published (1 or 0) before it commits: an error reported after that row, the COMMIT's
	// included, means it was all rolled back.
	tmplPublish           = publishBegin + tmplPublishUpdate + publishEnd
	tmplPublishAndRelease = publishBegin + tmplPublishAndReleaseUpdate + publishEnd

	publishBegin = autocommit + writes + incarnationOK + `DECLARE @rows INT;
` + lockRow + operationAbsent
	publishEnd = `;
SELECT @rows = @@ROWCOUNT;
IF @rows = 1
    INSERT INTO {operations} (op_id, outcome, resource, epoch, generation, recorded_at)
    VALUES (@op_id, 'accepted', @resource, @epoch, @generation, SYSUTCDATETIME());
SELECT @rows AS published;
COMMIT TRANSACTION;`

	// tmplRelease (resource, owner, generation, epoch) answers a row when it freed the lease.
	// It judges no expiry (releasing an expired lease changes nothing another could hold), so it
	// needs no lock before its UPDATE.
	tmplRelease = autocommit + writes + incarnationOK + `UPDATE {resources}
SET lease_owner = NULL, lease_until = NULL
OUTPUT inserted.generation
WHERE ` + leaseMatches

	// tmplRead (resource).
	tmplRead = autocommit + `SELECT epoch, generation, lease_owner, TODATETIMEOFFSET(lease_until, 0),
    published_epoch, published_generation, TODATETIMEOFFSET(published_at, 0), source_version,
    CAST(COALESCE(DATALENGTH(payload), 0) AS BIGINT), (SELECT epoch FROM {meta} WHERE id = 1),
    TODATETIMEOFFSET(SYSUTCDATETIME(), 0)
FROM {resources} WHERE resource = @resource`

	// tmplReadPayload (resource).
	tmplReadPayload = autocommit + `SELECT published_generation, payload FROM {resources} WHERE resource = @resource`

	// operationColumns is what Resolve and ReadOperation return.
	operationColumns = `outcome, resource, epoch, generation, TODATETIMEOFFSET(recorded_at, 0)`

	// tmplResolve (op_id) records the id as aborted unless an outcome is recorded, and returns
	// the outcome, in one transaction. The range lock of operationAbsent makes a concurrent
	// publication with this id wait for the commit and then refuse, or makes this insert wait
	// for the publication's commit and then find it.
	tmplResolve = autocommit + writes + `BEGIN TRANSACTION;
` + operationAbsent + `INSERT INTO {operations} (op_id, outcome, recorded_at)
SELECT @op_id, 'aborted', SYSUTCDATETIME()
WHERE @absent = 1;
SELECT ` + operationColumns + ` FROM {operations} WHERE op_id = @op_id;
COMMIT TRANSACTION;`

	// tmplReadOperation (op_id) records nothing.
	tmplReadOperation = autocommit + `SELECT ` + operationColumns + ` FROM {operations} WHERE op_id = @op_id`

	// tmplBumpEpoch () advances the epoch to max(epoch + 1, clockEpoch), records the database's
	// current incarnation and frees every lease, in one transaction, fenced_meta first (see
	// currentEpoch for why that order), and answers the new epoch. It refuses (51802) to record
	// an incarnation it cannot read.
	tmplBumpEpoch = autocommit + writes + incarnationVisible + `DECLARE @new_epoch BIGINT;
BEGIN TRANSACTION;
UPDATE {meta} SET @new_epoch = epoch = CASE WHEN epoch + 1 > ` + clockEpoch + ` THEN epoch + 1 ELSE ` + clockEpoch + ` END,
    ` + recordIncarnation + `
WHERE id = 1;
UPDATE {resources} SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL;
SELECT @new_epoch AS epoch;
COMMIT TRANSACTION;`

	// tmplPrune (age_s, age_us) deletes the records older than engine-now - age, the age
	// split as TTLs are (see splitTTL), pruneBatch rows per DELETE, each its own autocommit
	// transaction, and answers how many in all. A single DELETE of many rows would take more
	// than 5,000 locks and escalate to a lock on the whole table
	// (https://learn.microsoft.com/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide#lock-escalation),
	// stalling every publication and Resolve until it commits; a batch takes one key lock per
	// row in each of the table's two indexes, well below that. An error ends the batch with the
	// earlier DELETEs committed: the driver never reports a failed prune as not applied.
	tmplPrune = autocommit + writes + `DECLARE @deleted BIGINT = 0, @n INT = 1;
DECLARE @cutoff DATETIME2(7) = DATEADD(second, -@age_s, DATEADD(microsecond, -@age_us, SYSUTCDATETIME()));
WHILE @n > 0
BEGIN
    DELETE TOP (` + pruneBatchText + `) FROM {operations} WHERE recorded_at < @cutoff;
    SET @n = @@ROWCOUNT;
    SET @deleted = @deleted + @n;
END;
SELECT @deleted AS deleted;`

	// sqlDurability reads the current database's delayed durability setting. The database a
	// session is connected to is always visible in sys.databases, whatever its permissions.
	sqlDurability = `SELECT delayed_durability_desc FROM sys.databases WHERE database_id = DB_ID()`
)

// pruneBatch is how many records one DELETE of tmplPrune removes (pruneBatchText in the SQL).
const (
	pruneBatch     = 1000
	pruneBatchText = "1000"
)

// Migration statements. They run in one transaction; see Driver.Migrate.
const (
	// sqlMigrationLock (lock, timeout_ms) takes an exclusive application lock owned by the
	// transaction, so concurrent Migrate calls run one after another; it is released at commit
	// or rollback. It returns sp_getapplock's status: 0 or 1 granted, negative refused.
	sqlMigrationLock = `DECLARE @status INT;
EXEC @status = sp_getapplock @Resource = @lock, @LockMode = 'Exclusive',
    @LockOwner = 'Transaction', @LockTimeout = @timeout_ms;
SELECT @status`

	// sqlCreateSchema (schema). CREATE SCHEMA must be alone in its batch, hence sp_executesql.
	sqlCreateSchema = `IF SCHEMA_ID(@schema) IS NULL
BEGIN
    DECLARE @ddl NVARCHAR(300) = N'CREATE SCHEMA ' + QUOTENAME(@schema);
    EXEC sp_executesql @ddl;
END`

	tmplCreateMigrations = `IF OBJECT_ID(N'{migrations}', N'U') IS NULL
    CREATE TABLE {migrations} (
        version    INT          NOT NULL PRIMARY KEY,
        applied_at DATETIME2(7) NOT NULL
    )`

	tmplSchemaVersion = `SELECT COALESCE(MAX(version), 0) FROM {migrations}`

	// tmplRecordMigration (version).
	tmplRecordMigration = `INSERT INTO {migrations} (version, applied_at) VALUES (@version, SYSUTCDATETIME())`

	// tmplRecordIncarnation runs, in its own batch, after a Migrate that applied a migration:
	// the first time (no incarnation recorded yet, so on a new store and on the upgrade that
	// added the columns) it records the database's incarnation and raises the epoch to the
	// engine's clock (clockEpoch), so that a store created from nothing issues tokens above
	// those of any store it replaces. Raising the epoch frees no lease: a held lease keeps the
	// epoch it was issued with, and every later acquisition carries a greater one. It never
	// overwrites a recorded incarnation: after a restore, only BumpEpoch accepts the new one.
	// A login that applies no migration (a granted role) never runs it.
	tmplRecordIncarnation = incarnationVisible + `UPDATE {meta}
SET epoch = CASE WHEN epoch < ` + clockEpoch + ` THEN ` + clockEpoch + ` ELSE epoch END,
    ` + recordIncarnation + `
WHERE id = 1 AND recovery_fork_guid IS NULL`

	// tmplStaleProcedures (no parameters; the list is built by newStatements) answers the
	// operations whose procedure is missing or lacks its fingerprint (see fingerprint).
	// OBJECT_DEFINITION is visible to the procedures' owner and to a role that Grant gave VIEW
	// DEFINITION on the schema.
	tmplStaleProcedures = `SELECT n FROM (VALUES {list}) AS p (n, name, fp)
WHERE CHARINDEX(fp, COALESCE(OBJECT_DEFINITION(OBJECT_ID(name, N'P')), N'')) = 0`
)

// op names one protocol operation, and the procedure that runs it.
type op int

const (
	opProvision op = iota
	opAcquire
	opRenew
	opPublish
	opPublishAndRelease
	opRelease
	opRead
	opReadPayload
	opResolve
	opReadOperation
	opBumpEpoch
	opPrune
	numOps
)

// routine is one operation's statement and the parameters it takes, as its procedure declares
// them. Strings are NVARCHAR(4000), wider than any column they are compared with, so that a
// procedure never truncates an argument into another row's key.
type routine struct {
	procedure string // name in the schema, unquoted
	text      string // the template, with table placeholders
	params    string // the procedure's parameter declarations
}

const (
	pResource = "@resource NVARCHAR(4000)"
	pLease    = pResource + ", @owner NVARCHAR(4000), @generation BIGINT, @epoch BIGINT"
	pTTL      = "@ttl_s INT, @ttl_us INT"
	pPublish  = pLease + ", @payload VARBINARY(MAX), @source_version BIGINT, @op_id NVARCHAR(4000)"
)

// takesResource reports whether the operation names a resource: its procedure checks the
// caller's prefixes (prefixCheck).
func (rt routine) takesResource() bool { return strings.HasPrefix(rt.params, pResource) }

// routines is the one place that pairs each operation with its SQL: Migrate installs text as
// the body of the operation's procedure, and the driver calls that procedure.
var routines = [numOps]routine{
	opProvision:         {"fenced_provision", tmplProvision, pResource},
	opAcquire:           {"fenced_acquire", tmplAcquire, pResource + ", @owner NVARCHAR(4000), " + pTTL},
	opRenew:             {"fenced_renew", tmplRenew, pLease + ", " + pTTL},
	opPublish:           {"fenced_publish", tmplPublish, pPublish},
	opPublishAndRelease: {"fenced_publish_and_release", tmplPublishAndRelease, pPublish},
	opRelease:           {"fenced_release", tmplRelease, pLease},
	opRead:              {"fenced_read", tmplRead, pResource},
	opReadPayload:       {"fenced_read_payload", tmplReadPayload, pResource},
	opResolve:           {"fenced_resolve", tmplResolve, "@op_id NVARCHAR(4000)"},
	opReadOperation:     {"fenced_read_operation", tmplReadOperation, "@op_id NVARCHAR(4000)"},
	opBumpEpoch:         {"fenced_bump_epoch", tmplBumpEpoch, ""},
	opPrune:             {"fenced_prune_operations", tmplPrune, "@age_s INT, @age_us INT"},
}

// access is the level Grant requires for each operation (see driver.Access).
var access = [numOps]driver.Access{
	opProvision:         driver.AccessAdmin,
	opAcquire:           driver.AccessWorker,
	opRenew:             driver.AccessWorker,
	opPublish:           driver.AccessWorker,
	opPublishAndRelease: driver.AccessWorker,
	opRelease:           driver.AccessWorker,
	opRead:              driver.AccessReader,
	opReadPayload:       driver.AccessReader,
	opResolve:           driver.AccessWorker,
	opReadOperation:     driver.AccessReader,
	opBumpEpoch:         driver.AccessAdmin,
	opPrune:             driver.AccessAdmin,
}

// tables are the tables fenced keeps in its schema, by placeholder.
var tables = []struct{ placeholder, name string }{
	{"{resources}", "fenced_resources"},
	{"{meta}", "fenced_meta"},
	{"{operations}", "fenced_operations"},
	{"{migrations}", "fenced_schema_migrations"},
	{"{grants}", "fenced_grants"},
}

// statements are one driver's statements with its schema's table names filled in.
type statements struct {
	// text is each operation's batch: the body of its procedure.
	text [numOps]string
	// procedure is each operation's procedure, schema-qualified and quoted; the driver calls
	// it by name (an RPC with named parameters).
	procedure [numOps]string
	// create is each procedure's CREATE OR ALTER, its body text[op] and its fingerprint.
	create [numOps]string
	// fingerprint identifies create[op]'s text (see fingerprint).
	fingerprint [numOps]string

	acquireUpdate                                    string // the raw baseline's acquisition
	createMigrations, schemaVersion, recordMigration string
	recordIncarnation, staleProcedures               string
	// table is each table's qualified, quoted name, by its unquoted name.
	table map[string]string
	// names fills the table names into another text (a migration).
	names *strings.Replacer
}

func newStatements(schema string) statements {
	q := quoteName(schema) + "."
	var pairs []string
	s := statements{table: map[string]string{}}
	for _, t := range tables {
		pairs = append(pairs, t.placeholder, q+quoteName(t.name))
		s.table[t.name] = q + quoteName(t.name)
	}
	r := strings.NewReplacer(pairs...)
	var list []string
	for o, rt := range routines {
		text := rt.text
		if rt.takesResource() {
			text = withPrefixCheck(text)
		}
		s.text[o] = r.Replace(text)
		s.procedure[o] = q + quoteName(rt.procedure)
		s.create[o], s.fingerprint[o] = createProcedure(s.procedure[o], rt.params, s.text[o])
		// The names are validated identifiers and the fingerprints hex: nothing to escape
		// but the quote, doubled as a second guard.
		list = append(list, fmt.Sprintf("(%d, N'%s', N'%s')", o,
			strings.ReplaceAll(s.procedure[o], "'", "''"), s.fingerprint[o]))
	}
	s.acquireUpdate = r.Replace(tmplAcquireUpdate)
	s.createMigrations = r.Replace(tmplCreateMigrations)
	s.schemaVersion = r.Replace(tmplSchemaVersion)
	s.recordMigration = r.Replace(tmplRecordMigration)
	s.recordIncarnation = r.Replace(tmplRecordIncarnation)
	s.staleProcedures = strings.Replace(tmplStaleProcedures, "{list}", strings.Join(list, ", "), 1)
	s.names = r
	return s
}

// createProcedure is the CREATE OR ALTER PROCEDURE batch for one operation, and the
// fingerprint written into it. The body is the driver's own statement: SET options made in a
// procedure revert when it returns. There is no EXECUTE AS: the procedures rely on ownership
// chaining (see grant.go).
//
// The fingerprint is a hash of the procedure's text, kept as a comment in its body, which SQL
// Server stores with the procedure (OBJECT_DEFINITION returns it). Migrate looks for it to
// tell a procedure this version of the package installed from a missing or older one, and
// replaces only those: a login that may not alter the schema (a granted role) can run Migrate
// as long as the owner already installed this version's procedures.
func createProcedure(name, params, body string) (text, fp string) {
	if params != "" {
		params = "\n    " + params
	}
	head := "CREATE OR ALTER PROCEDURE " + name + params + "\nAS\nBEGIN\n"
	sum := sha256.Sum256([]byte(head + body))
	fp = "fenced:" + hex.EncodeToString(sum[:16])
	return head + "-- " + fp + "\n" + body + "\nEND", fp
}

// quoteName brackets an identifier as QUOTENAME does, doubling any ']'. Schema and role names
// are validated as plain identifiers before they get here; the escaping is a second guard.
func quoteName(name string) string { return "[" + strings.ReplaceAll(name, "]", "]]") + "]" }

// splitTTL turns a TTL into DATEADD's INT arguments: whole seconds and the microseconds left
// over. Nanoseconds below a microsecond are dropped, which only shortens the lease. The values
// are int32 so that go-mssqldb sends them as INT, DATEADD's own type.
func splitTTL(ttl time.Duration) (seconds, micros int32, err error) {
	if ttl < time.Microsecond {
		return 0, 0, fmt.Errorf("split ttl: %s is shorter than a microsecond", ttl)
	}
	s := ttl / time.Second
	if s > math.MaxInt32 {
		return 0, 0, fmt.Errorf("split ttl: %s is longer than DATEADD can add (%d s)", ttl, math.MaxInt32)
	}
	return int32(s), int32((ttl % time.Second) / time.Microsecond), nil
}

func resourceArgs(resource string) []any { return []any{sql.Named("resource", resource)} }

func acquireArgs(resource, owner string, ttl time.Duration) ([]any, error) {
	s, us, err := splitTTL(ttl)
	if err != nil {
		return nil, err
	}
	return []any{sql.Named("resource", resource), sql.Named("owner", owner),
		sql.Named("ttl_s", s), sql.Named("ttl_us", us)}, nil
}

func leaseArgs(l driver.LeaseRef) []any {
	return []any{sql.Named("resource", l.Resource), sql.Named("owner", l.Owner),
		sql.Named("generation", l.Generation), sql.Named("epoch", l.Epoch)}
}

func renewArgs(l driver.LeaseRef, ttl time.Duration) ([]any, error) {
	s, us, err := splitTTL(ttl)
	if err != nil {
		return nil, err
	}
	return append(leaseArgs(l), sql.Named("ttl_s", s), sql.Named("ttl_us", us)), nil
}

func publishArgs(l driver.LeaseRef, p driver.Publication) []any {
	return append(leaseArgs(l), sql.Named("payload", nonNil(p.Payload)),
		sql.Named("source_version", p.SourceVersion), sql.Named("op_id", p.OpID))
}

func opArgs(opID string) []any { return []any{sql.Named("op_id", opID)} }

func pruneArgs(age time.Duration) ([]any, error) {
	s, us, err := splitTTL(age)
	if err != nil {
		return nil, err
	}
	return []any{sql.Named("age_s", s), sql.Named("age_us", us)}, nil
}

// nonNil stores an empty payload as an empty VARBINARY rather than NULL, which means "nothing
// published".
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
