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
// on, go-mssqldb's RowsAffected is 0, so an accepted publication would look refused. With
// IMPLICIT_TRANSACTIONS on, an UPDATE (or a SELECT, which then leaves the connection inside a
// transaction for the next statement) would open a transaction that nobody commits, and an
// acknowledged change would be rolled back when the connection is reset. Settings made in a
// parameterized batch (sp_executesql) revert when the batch ends.
const autocommit = "SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF;\n"

const (
	// tmplProvision (resource) inserts the row unless it exists. Without the hints, two
	// sessions could both find no row under READ COMMITTED (no lock is held on a key that is
	// not there) and both insert, the second failing on the primary key. UPDLOCK with HOLDLOCK
	// takes a key-range update lock for the missing key, so the second session waits for the
	// first to commit and then sees its row. (HOLDLOCK alone would take shared range locks that
	// both sessions get, and then deadlock on the insert.) A duplicate-key error is still
	// treated as success, for callers whose session isolation changes the hints' effect.
	tmplProvision = autocommit + `INSERT INTO {resources} (resource)
SELECT @resource
WHERE NOT EXISTS (SELECT 1 FROM {resources} WITH (UPDLOCK, HOLDLOCK) WHERE resource = @resource)`

	// tmplAcquireUpdate (resource, owner, ttl_s, ttl_us) is the acquisition itself (the raw
	// benchmark baseline runs it alone). Its OUTPUT row carries acquired = 1.
	tmplAcquireUpdate = `UPDATE {resources}
SET generation = generation + 1, lease_owner = @owner, lease_until = ` + leaseEnd + `
OUTPUT inserted.generation, TODATETIMEOFFSET(inserted.lease_until, 0), 1 AS acquired
WHERE resource = @resource AND (lease_until IS NULL OR lease_until <= SYSUTCDATETIME())`

	// tmplAcquire runs the acquisition and, in the same round trip and only when it matched no
	// row, reads the holder (acquired = 0) to say why. The read decides nothing: the refusal
	// was the UPDATE's. No row at all means the resource is not provisioned.
	tmplAcquire = autocommit + tmplAcquireUpdate + `;
IF @@ROWCOUNT = 0
    SELECT generation, TODATETIMEOFFSET(lease_until, 0), 0 AS acquired FROM {resources} WHERE resource = @resource`

	// tmplRenew (resource, owner, generation, ttl_s, ttl_us).
	tmplRenew = autocommit + `UPDATE {resources}
SET lease_until = ` + leaseEnd + `
OUTPUT TODATETIMEOFFSET(inserted.lease_until, 0)
WHERE resource = @resource AND lease_owner = @owner AND generation = @generation
  AND lease_until > SYSUTCDATETIME()`

	// tmplPublish (resource, owner, generation, payload).
	tmplPublish = autocommit + `UPDATE {resources}
SET payload = @payload, published_generation = @generation, published_at = SYSUTCDATETIME()
WHERE resource = @resource AND lease_owner = @owner AND generation = @generation
  AND lease_until > SYSUTCDATETIME() AND published_generation < @generation`

	// tmplPublishAndRelease has tmplPublish's parameters.
	tmplPublishAndRelease = autocommit + `UPDATE {resources}
SET payload = @payload, published_generation = @generation, published_at = SYSUTCDATETIME(),
    lease_owner = NULL, lease_until = NULL
WHERE resource = @resource AND lease_owner = @owner AND generation = @generation
  AND lease_until > SYSUTCDATETIME() AND published_generation < @generation`

	// tmplRelease (resource, owner, generation).
	tmplRelease = autocommit + `UPDATE {resources}
SET lease_owner = NULL, lease_until = NULL
WHERE resource = @resource AND lease_owner = @owner AND generation = @generation`

	// tmplRead (resource).
	tmplRead = autocommit + `SELECT generation, lease_owner, TODATETIMEOFFSET(lease_until, 0), published_generation,
    TODATETIMEOFFSET(published_at, 0), CAST(COALESCE(DATALENGTH(payload), 0) AS BIGINT),
    TODATETIMEOFFSET(SYSUTCDATETIME(), 0)
FROM {resources} WHERE resource = @resource`

	// tmplReadPayload (resource).
	tmplReadPayload = autocommit + `SELECT published_generation, payload FROM {resources} WHERE resource = @resource`
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

// statements are one driver's statements with its schema's table names filled in.
type statements struct {
	provision, acquireUpdate, acquire, renew, publish, publishAndRelease, release string
	read, readPayload                                                             string
	createMigrations, schemaVersion, recordMigration                              string
	// names fills the table names into another text (a migration).
	names *strings.Replacer
}

func newStatements(schema string) statements {
	q := quoteName(schema) + "."
	r := strings.NewReplacer("{resources}", q+"[fenced_resources]", "{migrations}", q+"[fenced_schema_migrations]")
	return statements{
		provision:         r.Replace(tmplProvision),
		acquireUpdate:     r.Replace(tmplAcquireUpdate),
		acquire:           r.Replace(tmplAcquire),
		renew:             r.Replace(tmplRenew),
		publish:           r.Replace(tmplPublish),
		publishAndRelease: r.Replace(tmplPublishAndRelease),
		release:           r.Replace(tmplRelease),
		read:              r.Replace(tmplRead),
		readPayload:       r.Replace(tmplReadPayload),
		createMigrations:  r.Replace(tmplCreateMigrations),
		schemaVersion:     r.Replace(tmplSchemaVersion),
		recordMigration:   r.Replace(tmplRecordMigration),
		names:             r,
	}
}

// quoteName brackets an identifier that validSchema has accepted (so it holds no ']').
func quoteName(name string) string { return "[" + name + "]" }

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
		sql.Named("generation", l.Generation)}
}

func renewArgs(l driver.LeaseRef, ttl time.Duration) ([]any, error) {
	s, us, err := splitTTL(ttl)
	if err != nil {
		return nil, err
	}
	return append(leaseArgs(l), sql.Named("ttl_s", s), sql.Named("ttl_us", us)), nil
}

func publishArgs(l driver.LeaseRef, payload []byte) []any {
	return append(leaseArgs(l), sql.Named("payload", nonNil(payload)))
}

// nonNil stores an empty payload as an empty VARBINARY rather than NULL, which means "nothing
// published".
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
