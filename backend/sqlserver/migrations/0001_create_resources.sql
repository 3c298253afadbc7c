-- One row per resource: the lease (owner, expiry, generation) beside the published result.
-- Times are DATETIME2(7) in UTC, always written from SYSUTCDATETIME(): DATETIME2 carries no
-- time zone and SYSUTCDATETIME() does not depend on the server's time zone setting.
-- Names compare code point by code point (a BIN2 collation), whatever the database's default
-- collation is: under a case-insensitive default, owner 'abc' would match 'ABC'. Trailing
-- spaces are the one exception SQL Server makes to exact comparison of NVARCHAR; the driver
-- refuses resource names that end in a space for that reason (see checkResource).
-- {resources} is replaced with the schema-qualified, bracket-quoted table name.
-- The whole migration runs in one transaction under an application lock (see Migrate), so it
-- needs no IF NOT EXISTS: it either ran and was recorded, or it did not run at all.
CREATE TABLE {resources} (
    resource             NVARCHAR(255) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
    generation           BIGINT         NOT NULL DEFAULT 0,
    lease_owner          NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NULL,
    lease_until          DATETIME2(7)   NULL,
    published_generation BIGINT         NOT NULL DEFAULT 0,
    payload              VARBINARY(MAX) NULL,
    published_at         DATETIME2(7)   NULL
);
