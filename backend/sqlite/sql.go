package sqlite

// nowMicros is SQLite's clock in microseconds since the Unix epoch (millisecond resolution).
// SQLite evaluates 'now' once per statement step, so every comparison in one statement sees
// the same instant.
const nowMicros = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

// epochClock is the clock a new or bumped epoch is taken from: the system's real-time clock in
// microseconds since 1970, read through fenced_epoch_clock_us (registered by this package for
// every connection). SQLite runs inside the process, so its clock is the process's; its own
// functions read that clock in whole milliseconds only, and a store deleted and created again
// within one millisecond would then start at the epoch it had. WithClockOffsetFile does not
// move this clock: a jump of the expiry clock must not move epochs.
const epochClock = `fenced_epoch_clock_us()`

// currentEpoch is the store's epoch, read inside the statement that uses it.
const currentEpoch = `(SELECT epoch FROM fenced_meta WHERE id = 1)`

// leaseMatches is the condition every lease-carrying statement shares: ?1 resource, ?2 owner,
// ?3 generation, ?4 epoch.
const leaseMatches = `resource = ?1 AND lease_owner = ?2 AND generation = ?3 AND epoch = ?4`

const (
	sqlProvision = `INSERT INTO fenced_resources (resource) VALUES (?) ON CONFLICT (resource) DO NOTHING`

	sqlAcquire = `UPDATE fenced_resources
SET generation = generation + 1, epoch = ` + currentEpoch + `, lease_owner = ?2, lease_until = ` + nowMicros + ` + ?3
WHERE resource = ?1 AND (lease_until IS NULL OR lease_until <= ` + nowMicros + `)
RETURNING epoch, generation, lease_until`

	sqlRenew = `UPDATE fenced_resources
SET lease_until = ` + nowMicros + ` + ?5
WHERE ` + leaseMatches + ` AND lease_until > ` + nowMicros + `
RETURNING lease_until`

	// publishSet and publishWhere: ?5 payload, ?6 source version (0: none), ?7 operation id.
	publishSet = `payload = ?5, published_generation = ?3, published_epoch = ?4, published_at = ` + nowMicros + `,
    source_version = CASE WHEN ?6 > 0 THEN ?6 ELSE source_version END`
	publishWhere = leaseMatches + ` AND lease_until > ` + nowMicros + `
  AND published_generation < ?3 AND (?6 = 0 OR source_version <= ?6)
  AND NOT EXISTS (SELECT 1 FROM fenced_operations WHERE op_id = ?7)`

	sqlPublish = `UPDATE fenced_resources SET ` + publishSet + ` WHERE ` + publishWhere

	sqlPublishAndRelease = `UPDATE fenced_resources SET ` + publishSet + `, lease_owner = NULL, lease_until = NULL
WHERE ` + publishWhere

	// sqlRecordAccepted runs in the publication's transaction, after its UPDATE matched.
	sqlRecordAccepted = `INSERT INTO fenced_operations (op_id, outcome, resource, epoch, generation, recorded_at)
VALUES (?7, 'accepted', ?1, ?4, ?3, ` + nowMicros + `)`

	sqlRelease = `UPDATE fenced_resources
SET lease_owner = NULL, lease_until = NULL
WHERE ` + leaseMatches

	sqlRead = `SELECT epoch, generation, lease_owner, lease_until, published_epoch, published_generation,
    published_at, source_version, coalesce(length(payload), 0), ` + currentEpoch + `, ` + nowMicros + `
FROM fenced_resources WHERE resource = ?`

	sqlReadPayload = `SELECT published_generation, payload FROM fenced_resources WHERE resource = ?`

	// sqlResolve records the id as aborted unless an outcome exists, and returns the outcome:
	// the no-op DO UPDATE makes RETURNING report the existing row.
	sqlResolve = `INSERT INTO fenced_operations (op_id, outcome, recorded_at) VALUES (?1, 'aborted', ` + nowMicros + `)
ON CONFLICT (op_id) DO UPDATE SET op_id = excluded.op_id
RETURNING outcome, resource, epoch, generation, recorded_at`

	sqlReadOperation = `SELECT outcome, resource, epoch, generation, recorded_at FROM fenced_operations WHERE op_id = ?1`

	// sqlBumpEpoch sets the epoch to max(epoch + 1, the clock): see driver.Driver.BumpEpoch.
	sqlBumpEpoch = `UPDATE fenced_meta SET epoch = max(epoch + 1, ` + epochClock + `) WHERE id = 1 RETURNING epoch`

	sqlFreeAll = `UPDATE fenced_resources SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL`

	sqlPrune = `DELETE FROM fenced_operations WHERE recorded_at < ` + nowMicros + ` - ?1`
)
