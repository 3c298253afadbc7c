-- One row per resource: the lease (owner, expiry, generation) beside the published result.
-- Times are DATETIME(6) in UTC, always written from UTC_TIMESTAMP(6): a DATETIME carries no
-- time zone, so no session's time_zone setting ever shifts them. Names are VARBINARY so that
-- they compare byte for byte like in every other backend (utf8mb4_bin pads trailing spaces:
-- 'a' and 'a ' would be one key) and so that the 255-byte limit is in bytes, not characters.
-- IF NOT EXISTS: DDL commits by itself, so a migration interrupted before its version row was
-- written runs again and must be harmless the second time.
CREATE TABLE IF NOT EXISTS fenced_resources (
    resource             VARBINARY(255) NOT NULL PRIMARY KEY,
    generation           BIGINT         NOT NULL DEFAULT 0,
    lease_owner          VARBINARY(128) NULL,
    lease_until          DATETIME(6)    NULL,
    published_generation BIGINT         NOT NULL DEFAULT 0,
    payload              LONGBLOB       NULL,
    published_at         DATETIME(6)    NULL
) ENGINE = InnoDB;
