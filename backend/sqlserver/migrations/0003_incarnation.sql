-- The database's incarnation (sys.database_recovery_status) as recorded at the last Migrate
-- that created it and at every BumpEpoch; every lease-carrying batch compares it with the
-- database's own. The values are filled in by Migrate in a batch of its own right after this
-- one (a batch cannot use a column that it adds), together with raising the epoch to the
-- engine's clock in microseconds since 1970 (see clockEpoch in sql.go).
ALTER TABLE {meta} ADD
    recovery_fork_guid UNIQUEIDENTIFIER NULL,
    database_guid      UNIQUEIDENTIFIER NULL;
