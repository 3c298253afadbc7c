-- The resource-name prefixes each role that Grant set up may use (the empty prefix: every
-- resource). Only Grant, run by the tables' owner, writes it; Grant DENYs every change to it to
-- the role. The procedures that take a resource read it (see prefixCheck in sql.go). The
-- columns have the types and the binary collation of the names they are compared with;
-- role_name is the database role's name as Grant was given it.
CREATE TABLE {grants} (
    role_name NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
    prefix    NVARCHAR(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    PRIMARY KEY (role_name, prefix)
);
