package sqlserver

import (
	"database/sql"
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
// in a procedure revert when it ends.
const autocommit = "SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF;\n"

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

// leaseMatches is the condition every lease-carrying statement shares.
const leaseMatches = `resource = @resource AND lease_owner = @owner AND generation = @generation AND epoch = @epoch`

// operationAbsent is true while the operation id has no recorded outcome. UPDLOCK with
// HOLDLOCK takes a key-range update lock on the id even when no row has it, held to the end of
// the transaction, so a publication and a Resolve (or two publications) carrying one id run
// one after another: the second sees the first's record.
const operationAbsent = `NOT EXISTS (SELECT 1 FROM {operations} WITH (UPDLOCK, HOLDLOCK) WHERE op_id = @op_id)`

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

	// tmplAcquire runs the acquisition and, in the same round trip and only when it matched no
	// row, reads the holder (acquired = 0) to say why. The read decides nothing: the refusal
	// was the UPDATE's. No row at all means the resource is not provisioned. The UPDATE is an
	// autocommit statement and the read runs only when it changed nothing, so an error in
	// either means nothing changed.
	tmplAcquire = autocommit + writes + tmplAcquireUpdate + `;
IF @@ROWCOUNT = 0
    SELECT epoch, generation, TODATETIMEOFFSET(lease_until, 0), 0 AS acquired FROM {resources} WHERE resource = @resource`

	// tmplRenew (resource, owner, generation, epoch, ttl_s, ttl_us).
	tmplRenew = autocommit + writes + `UPDATE {resources}
SET lease_until = ` + leaseEnd + `
OUTPUT TODATETIMEOFFSET(inserted.lease_until, 0)
WHERE ` + leaseMatches + ` AND lease_until > SYSUTCDATETIME()`

	// publishSet and publishWhere: the publication's own parameters are payload,
	// source_version (0: none) and op_id.
	publishSet = `payload = @payload, published_generation = @generation, published_epoch = @epoch,
    published_at = SYSUTCDATETIME(),
    source_version = CASE WHEN @source_version > 0 THEN @source_version ELSE source_version END`
	publishWhere = leaseMatches + ` AND lease_until > SYSUTCDATETIME()
  AND published_generation < @generation AND (@source_version = 0 OR source_version <= @source_version)
  AND ` + operationAbsent

	// tmplPublishUpdate and tmplPublishAndReleaseUpdate are the conditional UPDATEs that
	// tmplPublish and tmplPublishAndRelease wrap.
	tmplPublishUpdate           = `UPDATE {resources} SET ` + publishSet + ` WHERE ` + publishWhere
	tmplPublishAndReleaseUpdate = `UPDATE {resources} SET ` + publishSet + `,
    lease_owner = NULL, lease_until = NULL
WHERE ` + publishWhere

	// tmplPublish and tmplPublishAndRelease (resource, owner, generation, epoch, payload,
	// source_version, op_id) store the publication and record the operation id as accepted in
	// one transaction, and answer how many rows were published (1 or 0) before it commits: an
	// error reported after that row, the COMMIT's included, means it was all rolled back.
	tmplPublish           = publishBegin + tmplPublishUpdate + publishEnd
	tmplPublishAndRelease = publishBegin + tmplPublishAndReleaseUpdate + publishEnd

	publishBegin = autocommit + writes + `DECLARE @rows INT;
BEGIN TRANSACTION;
`
	publishEnd = `;
SELECT @rows = @@ROWCOUNT;
IF @rows = 1
    INSERT INTO {operations} (op_id, outcome, resource, epoch, generation, recorded_at)
    VALUES (@op_id, 'accepted', @resource, @epoch, @generation, SYSUTCDATETIME());
SELECT @rows AS published;
COMMIT TRANSACTION;`

	// tmplRelease (resource, owner, generation, epoch) answers a row when it freed the lease.
	tmplRelease = autocommit + writes + `UPDATE {resources}
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
INSERT INTO {operations} (op_id, outcome, recorded_at)
SELECT @op_id, 'aborted', SYSUTCDATETIME()
WHERE ` + operationAbsent + `;
SELECT ` + operationColumns + ` FROM {operations} WHERE op_id = @op_id;
COMMIT TRANSACTION;`

	// tmplReadOperation (op_id) records nothing.
	tmplReadOperation = autocommit + `SELECT ` + operationColumns + ` FROM {operations} WHERE op_id = @op_id`

	// tmplBumpEpoch () advances the epoch and frees every lease in one transaction, fenced_meta
	// first (see currentEpoch for why that order), and answers the new epoch.
	tmplBumpEpoch = autocommit + writes + `DECLARE @new_epoch BIGINT;
BEGIN TRANSACTION;
UPDATE {meta} SET @new_epoch = epoch = epoch + 1 WHERE id = 1;
UPDATE {resources} SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL;
SELECT @new_epoch AS epoch;
COMMIT TRANSACTION;`

	// tmplPrune (age_s, age_us) deletes the records older than engine-now - age, the age
	// split as TTLs are (see splitTTL), and answers how many.
	tmplPrune = autocommit + writes + `DECLARE @deleted BIGINT;
BEGIN TRANSACTION;
DELETE FROM {operations}
WHERE recorded_at < DATEADD(second, -@age_s, DATEADD(microsecond, -@age_us, SYSUTCDATETIME()));
SELECT @deleted = ROWCOUNT_BIG();
SELECT @deleted AS deleted;
COMMIT TRANSACTION;`

	// sqlDurability reads the current database's delayed durability setting. The database a
	// session is connected to is always visible in sys.databases, whatever its permissions.
	sqlDurability = `SELECT delayed_durability_desc FROM sys.databases WHERE database_id = DB_ID()`

	// sqlPrivileges (table, procedure) tells whether this login may update the resources table
	// (HAS_PERMS_BY_NAME counts DENY and role memberships) and whether the protocol's
	// procedures are installed. See Driver.detect.
	sqlPrivileges = `SELECT HAS_PERMS_BY_NAME(@table, 'OBJECT', 'UPDATE'), OBJECT_ID(@procedure, 'P')`
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
)

// op names one protocol operation: a statement the driver sends, and the procedure Grant
// creates from that same statement.
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

// routine is one operation's statement and the parameters it takes, as a procedure declares
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

// routines is the one place that pairs each operation with its SQL: the driver sends text
// as it is (or calls the procedure), and Grant installs text as the procedure's body.
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

// tables are the tables fenced keeps in its schema, by placeholder.
var tables = []struct{ placeholder, name string }{
	{"{resources}", "fenced_resources"},
	{"{meta}", "fenced_meta"},
	{"{operations}", "fenced_operations"},
	{"{migrations}", "fenced_schema_migrations"},
}

// statements are one driver's statements with its schema's table names filled in.
type statements struct {
	// text is each operation's batch, sent with named parameters (sp_executesql).
	text [numOps]string
	// procedure is each operation's procedure, schema-qualified and quoted; the driver calls
	// it by name (an RPC with the same named parameters) when it runs as a role that Grant
	// set up. See Driver.detect.
	procedure [numOps]string
	// create is each procedure's CREATE OR ALTER, its body text[op].
	create [numOps]string

	acquireUpdate                                    string // the raw baseline's acquisition
	createMigrations, schemaVersion, recordMigration string
	resourcesTable, acquireProcedure                 string // for sqlPrivileges
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
	for o, rt := range routines {
		s.text[o] = r.Replace(rt.text)
		s.procedure[o] = q + quoteName(rt.procedure)
		s.create[o] = createProcedure(s.procedure[o], rt.params, s.text[o])
	}
	s.acquireUpdate = r.Replace(tmplAcquireUpdate)
	s.createMigrations = r.Replace(tmplCreateMigrations)
	s.schemaVersion = r.Replace(tmplSchemaVersion)
	s.recordMigration = r.Replace(tmplRecordMigration)
	s.resourcesTable = s.table["fenced_resources"]
	s.acquireProcedure = s.procedure[opAcquire]
	s.names = r
	return s
}

// createProcedure is the CREATE OR ALTER PROCEDURE batch for one operation. The body is the
// driver's own statement: SET options made in a procedure revert when it returns. There is no
// EXECUTE AS: the procedures rely on ownership chaining (see grant.go).
func createProcedure(name, params, body string) string {
	if params != "" {
		params = "\n    " + params
	}
	return "CREATE OR ALTER PROCEDURE " + name + params + "\nAS\nBEGIN\n" + body + "\nEND"
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
		return nil, fmt.Errorf("prune operations: %w", err)
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
