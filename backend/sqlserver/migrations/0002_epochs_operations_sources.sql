-- Recovery epochs, publication operation ids and source versions.
-- A token is (epoch, generation); every acquisition takes the store's current epoch, read from
-- {meta} inside the acquiring statement. A new schema starts at epoch 1.
-- {resources}, {meta} and {operations} are replaced with schema-qualified, bracket-quoted names.
ALTER TABLE {resources} ADD
    epoch           BIGINT NOT NULL DEFAULT 0,
    published_epoch BIGINT NOT NULL DEFAULT 0,
    source_version  BIGINT NOT NULL DEFAULT 0;

CREATE TABLE {meta} (
    id    INT    NOT NULL PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL
);
INSERT INTO {meta} (id, epoch) VALUES (1, 1);

-- Outcomes of publications by operation id. Later publications never overwrite a record:
-- 'accepted' is written with the payload, 'aborted' by Resolve for an id that never arrived.
-- Ids are printable ASCII compared exactly (BIN2), as NVARCHAR so that the NVARCHAR parameters
-- go-mssqldb sends seek the key instead of converting every row.
CREATE TABLE {operations} (
    op_id       NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
    outcome     VARCHAR(8)     NOT NULL CHECK (outcome IN ('accepted', 'aborted')),
    resource    NVARCHAR(255) COLLATE Latin1_General_100_BIN2 NULL,
    epoch       BIGINT         NULL,
    generation  BIGINT         NULL,
    recorded_at DATETIME2(7)   NOT NULL
);
CREATE INDEX fenced_operations_recorded_at ON {operations} (recorded_at);
