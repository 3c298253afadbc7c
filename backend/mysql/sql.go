package mysql

// The statements below use only UTC_TIMESTAMP(6) for the engine's clock, never NOW() or
// CURRENT_TIMESTAMP, whose value depends on the session's time_zone. MySQL evaluates the clock
// once per statement, so every comparison and assignment in one statement sees the same instant.
//
// Times are read back as integer microseconds since 1970-01-01 00:00:00 (TIMESTAMPDIFF against
// a DATETIME literal, which no time zone converts), so neither the session's time_zone nor the
// connection's parseTime and loc settings can change what is read.
//
// Placeholders are positional; each statement's comment gives the order of its arguments.

const (
	epoch = `TIMESTAMP'1970-01-01 00:00:00'`
	// nowMicros is the engine's clock in microseconds since the Unix epoch.
	nowMicros = `TIMESTAMPDIFF(MICROSECOND, ` + epoch + `, UTC_TIMESTAMP(6))`
	// leaseUntilMicros and publishedAtMicros read the columns the same way (NULL stays NULL).
	leaseUntilMicros  = `TIMESTAMPDIFF(MICROSECOND, ` + epoch + `, lease_until)`
	publishedAtMicros = `TIMESTAMPDIFF(MICROSECOND, ` + epoch + `, published_at)`
)

const (
	// sqlProvision (resource) inserts the row or leaves an existing one untouched. Not INSERT
	// IGNORE: that would turn every other error (a truncation, say) into a warning.
	sqlProvision = `INSERT INTO fenced_resources (resource) VALUES (?)
ON DUPLICATE KEY UPDATE resource = resource`

	// sqlAcquire (owner, ttl µs, resource). MySQL has no UPDATE ... RETURNING: the new generation
	// comes back in the same reply as the statement's last insert id, which LAST_INSERT_ID(expr)
	// sets only for a row it updated. It is trusted only when the statement matched one row.
	sqlAcquire = `UPDATE fenced_resources
SET generation = LAST_INSERT_ID(generation + 1), lease_owner = ?,
    lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE resource = ? AND (lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6))`

	// sqlRenew (ttl µs, resource, owner, generation). The new expiry is computed once, in
	// microseconds, handed to LAST_INSERT_ID (so that it comes back in the reply) and stored
	// from that same number: the value returned is exactly the value written. A renewal that
	// writes the value already there still matches, because connections report matched rows.
	sqlRenew = `UPDATE fenced_resources
SET lease_until = TIMESTAMPADD(MICROSECOND, LAST_INSERT_ID(` + nowMicros + ` + ?), ` + epoch + `)
WHERE resource = ? AND lease_owner = ? AND generation = ? AND lease_until > UTC_TIMESTAMP(6)`

	// sqlPublish (payload, generation, resource, owner, generation, generation).
	sqlPublish = `UPDATE fenced_resources
SET payload = ?, published_generation = ?, published_at = UTC_TIMESTAMP(6)
WHERE resource = ? AND lease_owner = ? AND generation = ? AND lease_until > UTC_TIMESTAMP(6)
  AND published_generation < ?`

	// sqlPublishAndRelease has sqlPublish's arguments.
	sqlPublishAndRelease = `UPDATE fenced_resources
SET payload = ?, published_generation = ?, published_at = UTC_TIMESTAMP(6),
    lease_owner = NULL, lease_until = NULL
WHERE resource = ? AND lease_owner = ? AND generation = ? AND lease_until > UTC_TIMESTAMP(6)
  AND published_generation < ?`

	// sqlRelease (resource, owner, generation).
	sqlRelease = `UPDATE fenced_resources
SET lease_owner = NULL, lease_until = NULL
WHERE resource = ? AND lease_owner = ? AND generation = ?`

	// sqlRead (resource).
	sqlRead = `SELECT generation, lease_owner, ` + leaseUntilMicros + `, published_generation,
    ` + publishedAtMicros + `, COALESCE(LENGTH(payload), 0), ` + nowMicros + `
FROM fenced_resources WHERE resource = ?`

	// sqlReadLease (resource) is the part of sqlRead that Acquire needs after its statement:
	// it leaves the payload alone.
	sqlReadLease = `SELECT generation, lease_owner, ` + leaseUntilMicros + `, ` + nowMicros + `
FROM fenced_resources WHERE resource = ?`

	// sqlReadPayload (resource).
	sqlReadPayload = `SELECT published_generation, payload FROM fenced_resources WHERE resource = ?`
)

// Publish, PublishAndRelease and Release share their arguments with the raw baseline, so the
// orders live in one place.

func publishArgs(resource, owner string, gen int64, payload []byte) []any {
	return []any{nonNil(payload), gen, resource, owner, gen, gen}
}

func releaseArgs(resource, owner string, gen int64) []any { return []any{resource, owner, gen} }

func acquireArgs(resource, owner string, ttlMicros int64) []any {
	return []any{owner, ttlMicros, resource}
}

// nonNil stores an empty payload as an empty blob rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
