package postgres

// Every statement reads the clock with clock_timestamp(), the time at the moment of the call.
// now() and CURRENT_TIMESTAMP are frozen at the start of the transaction, so a statement that
// waits on a row lock, or runs inside a transaction the caller opened earlier, would judge
// expiry against a time in the past and accept a lease that has already run out. When an
// UPDATE under READ COMMITTED waits for another transaction's row lock, PostgreSQL re-evaluates
// its WHERE clause against the newest row version after the wait, calling clock_timestamp()
// again, so the check is made at the moment the row is actually changed.
//
// Durations arrive as microseconds ($n) and become intervals in SQL.
const ttlInterval = `* interval '1 microsecond'`

const (
	sqlProvision = `INSERT INTO fenced_resources (resource) VALUES ($1) ON CONFLICT (resource) DO NOTHING`

	// sqlAcquire makes its decision in the UPDATE's WHERE clause and, in the same round trip,
	// reports why it refused: when the UPDATE changed nothing, the second branch returns the row
	// as the statement's snapshot shows it (no row at all: not provisioned). The snapshot is
	// taken when the statement starts; if the UPDATE then waited on a concurrent acquisition and
	// lost on the re-check, the snapshot still shows the lease free. seen_free says so, and the
	// driver reads the row again in that case only.
	sqlAcquire = `WITH acquired AS (
    UPDATE fenced_resources
    SET generation = generation + 1, lease_owner = $2,
        lease_until = clock_timestamp() + $3::bigint ` + ttlInterval + `
    WHERE resource = $1 AND (lease_until IS NULL OR lease_until <= clock_timestamp())
    RETURNING generation, lease_until
)
SELECT true, generation, lease_until, false FROM acquired
UNION ALL
SELECT false, generation, lease_until, (lease_until IS NULL OR lease_until <= clock_timestamp())
FROM fenced_resources
WHERE resource = $1 AND NOT EXISTS (SELECT FROM acquired)`

	sqlRenew = `UPDATE fenced_resources
SET lease_until = clock_timestamp() + $4::bigint ` + ttlInterval + `
WHERE resource = $1 AND lease_owner = $2 AND generation = $3 AND lease_until > clock_timestamp()
RETURNING lease_until`

	sqlPublish = `UPDATE fenced_resources
SET payload = $4, published_generation = $3, published_at = clock_timestamp()
WHERE resource = $1 AND lease_owner = $2 AND generation = $3 AND lease_until > clock_timestamp()
  AND published_generation < $3`

	sqlPublishAndRelease = `UPDATE fenced_resources
SET payload = $4, published_generation = $3, published_at = clock_timestamp(),
    lease_owner = NULL, lease_until = NULL
WHERE resource = $1 AND lease_owner = $2 AND generation = $3 AND lease_until > clock_timestamp()
  AND published_generation < $3`

	sqlRelease = `UPDATE fenced_resources
SET lease_owner = NULL, lease_until = NULL
WHERE resource = $1 AND lease_owner = $2 AND generation = $3`

	sqlRead = `SELECT generation, lease_owner, lease_until, published_generation, published_at,
    coalesce(octet_length(payload), 0), clock_timestamp()
FROM fenced_resources WHERE resource = $1`

	sqlReadPayload = `SELECT published_generation, payload FROM fenced_resources WHERE resource = $1`
)

// Migration statements. The lock key is one constant for every schema: migrations are rare,
// so serializing those of unrelated schemas costs nothing worth a per-schema key.
const (
	migrateLockKey = 0x66656e636564 // "fenced"

	sqlMigrateLock = `SELECT pg_advisory_xact_lock($1)`

	sqlMigrationsTable = `CREATE TABLE IF NOT EXISTS fenced_schema_migrations (
    version    integer     NOT NULL PRIMARY KEY,
    applied_at timestamptz NOT NULL
)`

	sqlMigrationsCurrent = `SELECT coalesce(max(version), 0) FROM fenced_schema_migrations`

	sqlMigrationsRecord = `INSERT INTO fenced_schema_migrations (version, applied_at) VALUES ($1, clock_timestamp())`
)
