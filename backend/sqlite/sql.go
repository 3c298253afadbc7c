package sqlite

// nowMicros is SQLite's clock in microseconds since the Unix epoch (millisecond resolution).
// SQLite evaluates 'now' once per statement step, so every comparison in one statement sees
// the same instant.
const nowMicros = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

const (
	sqlProvision = `INSERT INTO fenced_resources (resource) VALUES (?) ON CONFLICT (resource) DO NOTHING`

	sqlAcquire = `UPDATE fenced_resources
SET generation = generation + 1, lease_owner = ?2, lease_until = ` + nowMicros + ` + ?3
WHERE resource = ?1 AND (lease_until IS NULL OR lease_until <= ` + nowMicros + `)
RETURNING generation, lease_until`

	sqlRenew = `UPDATE fenced_resources
SET lease_until = ` + nowMicros + ` + ?4
WHERE resource = ?1 AND lease_owner = ?2 AND generation = ?3 AND lease_until > ` + nowMicros + `
RETURNING lease_until`

	sqlPublish = `UPDATE fenced_resources
SET payload = ?4, published_generation = ?3, published_at = ` + nowMicros + `
WHERE resource = ?1 AND lease_owner = ?2 AND generation = ?3 AND lease_until > ` + nowMicros + `
  AND published_generation < ?3`

	sqlPublishAndRelease = `UPDATE fenced_resources
SET payload = ?4, published_generation = ?3, published_at = ` + nowMicros + `,
    lease_owner = NULL, lease_until = NULL
WHERE resource = ?1 AND lease_owner = ?2 AND generation = ?3 AND lease_until > ` + nowMicros + `
  AND published_generation < ?3`

	sqlRelease = `UPDATE fenced_resources
SET lease_owner = NULL, lease_until = NULL
WHERE resource = ?1 AND lease_owner = ?2 AND generation = ?3`

	sqlRead = `SELECT generation, lease_owner, lease_until, published_generation, published_at,
    coalesce(length(payload), 0), ` + nowMicros + `
FROM fenced_resources WHERE resource = ?`

	sqlReadPayload = `SELECT published_generation, payload FROM fenced_resources WHERE resource = ?`
)
