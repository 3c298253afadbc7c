package sqlserver

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// forbiddenClocks are clock functions that must never judge or stamp a lease: they follow the
// server's time zone, or have DATETIME's 3 ms resolution.
var forbiddenClocks = []string{"GETDATE", "CURRENT_TIMESTAMP", "SYSDATETIME(", "GETUTCDATE",
	"SYSDATETIMEOFFSET", "NOW("}

func TestStatementsHoldTheProtocolConditions(t *testing.T) {
	s := newStatements(DefaultSchema)
	lease := []string{"resource = @resource", "lease_owner = @owner", "generation = @generation", "epoch = @epoch"}
	live := "lease_until > SYSUTCDATETIME()"
	lock := "DECLARE @locked INT;\nBEGIN TRANSACTION;\n" +
		"SELECT @locked = 1 FROM [dbo].[fenced_resources] WITH (UPDLOCK, ROWLOCK) WHERE resource = @resource;\n"
	opLock := "DECLARE @absent INT = 1;\n" +
		"SELECT @absent = 0 FROM [dbo].[fenced_operations] WITH (UPDLOCK, HOLDLOCK) WHERE op_id = @op_id;\n"
	incarnation := "IF NOT EXISTS (SELECT 1 FROM [dbo].[fenced_meta] WHERE id = 1\n" +
		"    AND recovery_fork_guid = (SELECT recovery_fork_guid FROM sys.database_recovery_status WHERE database_id = DB_ID())" +
		" AND database_guid = (SELECT database_guid FROM sys.database_recovery_status WHERE database_id = DB_ID()))\n" +
		"    THROW 51801, "
	publish := []string{"payload = @payload", "published_generation = @generation", "published_epoch = @epoch",
		"published_at = SYSUTCDATETIME()", live, "published_generation < @generation",
		"source_version = CASE WHEN @source_version > 0 THEN @source_version ELSE source_version END",
		"(@source_version = 0 OR source_version <= @source_version)", "AND @absent = 1",
		"DECLARE @rows INT;\n" + lock + opLock + "UPDATE [dbo].[fenced_resources] SET ",
		"SELECT @rows = @@ROWCOUNT;\nIF @rows = 1\n    INSERT INTO [dbo].[fenced_operations] (op_id, outcome, resource, epoch, generation, recorded_at)\n" +
			"    VALUES (@op_id, 'accepted', @resource, @epoch, @generation, SYSUTCDATETIME());\n" +
			"SELECT @rows AS published;\nCOMMIT TRANSACTION;", incarnation}
	tests := []struct {
		name     string
		op       op
		contains []string
		absent   []string
	}{
		{"provision", opProvision, []string{"INSERT INTO [dbo].[fenced_resources] (resource)",
			"WHERE NOT EXISTS", "WITH (UPDLOCK, HOLDLOCK) WHERE resource = @resource"}, []string{"UPDATE", "MERGE"}},
		{"acquire", opAcquire, []string{lock + "UPDATE [dbo].[fenced_resources]", "SET generation = generation + 1",
			"epoch = (SELECT epoch FROM [dbo].[fenced_meta] WITH (HOLDLOCK) WHERE id = 1)",
			"lease_owner = @owner",
			"OUTPUT inserted.epoch, inserted.generation, TODATETIMEOFFSET(inserted.lease_until, 0), 1 AS acquired",
			"WHERE resource = @resource AND (lease_until IS NULL OR lease_until <= SYSUTCDATETIME())",
			"lease_until = " + leaseEnd, "IF @@ROWCOUNT = 0",
			"SELECT epoch, generation, TODATETIMEOFFSET(lease_until, 0), 0 AS acquired FROM [dbo].[fenced_resources] WHERE resource = @resource;\nCOMMIT TRANSACTION;",
			incarnation},
			[]string{"@generation", "@epoch"}},
		{"renew", opRenew, append([]string{lock + "UPDATE [dbo].[fenced_resources]\nSET lease_until = " + leaseEnd,
			"OUTPUT TODATETIMEOFFSET(inserted.lease_until, 0)", live + ";\nCOMMIT TRANSACTION;", incarnation}, lease...),
			[]string{"generation + 1"}},
		{"publish", opPublish, append(publish, lease...), []string{"lease_owner = NULL"}},
		{"publish and release", opPublishAndRelease, append(append([]string{"lease_owner = NULL, lease_until = NULL"},
			publish...), lease...), nil},
		{"release", opRelease, append([]string{"SET lease_owner = NULL, lease_until = NULL", "OUTPUT inserted.generation",
			incarnation}, lease...), []string{"payload", "generation + 1", "SYSUTCDATETIME"}},
		{"read", opRead, []string{"SELECT epoch, generation, lease_owner, TODATETIMEOFFSET(lease_until, 0)",
			"published_epoch, published_generation, TODATETIMEOFFSET(published_at, 0), source_version",
			"(SELECT epoch FROM [dbo].[fenced_meta] WHERE id = 1)",
			"TODATETIMEOFFSET(SYSUTCDATETIME(), 0)", "DATALENGTH(payload)", "WHERE resource = @resource"}, nil},
		{"read payload", opReadPayload, []string{"published_generation, payload", "WHERE resource = @resource"}, nil},
		{"resolve", opResolve, []string{"BEGIN TRANSACTION;\n" + opLock + "INSERT INTO [dbo].[fenced_operations] (op_id, outcome, recorded_at)\n" +
			"SELECT @op_id, 'aborted', SYSUTCDATETIME()\n" +
			"WHERE @absent = 1;\n" +
			"SELECT outcome, resource, epoch, generation, TODATETIMEOFFSET(recorded_at, 0) FROM [dbo].[fenced_operations] WHERE op_id = @op_id;\n" +
			"COMMIT TRANSACTION;"}, []string{"UPDATE", "DELETE"}},
		{"read operation", opReadOperation, []string{"SELECT outcome, resource, epoch, generation, TODATETIMEOFFSET(recorded_at, 0) FROM [dbo].[fenced_operations] WHERE op_id = @op_id"},
			[]string{"INSERT", "BEGIN TRANSACTION", "XACT_ABORT"}},
		{"bump epoch", opBumpEpoch, []string{"THROW 51802, ", "DECLARE @new_epoch BIGINT;\nBEGIN TRANSACTION;\n" +
			"UPDATE [dbo].[fenced_meta] SET @new_epoch = epoch = CASE WHEN epoch + 1 > " + clockEpoch +
			" THEN epoch + 1 ELSE " + clockEpoch + " END,\n" +
			"    recovery_fork_guid = (SELECT recovery_fork_guid FROM sys.database_recovery_status WHERE database_id = DB_ID()), " +
			"database_guid = (SELECT database_guid FROM sys.database_recovery_status WHERE database_id = DB_ID())\n" +
			"WHERE id = 1;\n" +
			"UPDATE [dbo].[fenced_resources] SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL;\n" +
			"SELECT @new_epoch AS epoch;\nCOMMIT TRANSACTION;"}, []string{"generation", "THROW 51801"}},
		{"prune", opPrune, []string{"DECLARE @deleted BIGINT = 0, @n INT = 1;\n" +
			"DECLARE @cutoff DATETIME2(7) = DATEADD(second, -@age_s, DATEADD(microsecond, -@age_us, SYSUTCDATETIME()));\n" +
			"WHILE @n > 0\nBEGIN\n" +
			"    DELETE TOP (1000) FROM [dbo].[fenced_operations] WHERE recorded_at < @cutoff;\n" +
			"    SET @n = @@ROWCOUNT;\n    SET @deleted = @deleted + @n;\nEND;\n" +
			"SELECT @deleted AS deleted;"}, []string{"BEGIN TRANSACTION"}},
	}
	tested := map[op]bool{}
	for _, tt := range tests {
		tested[tt.op] = true
		t.Run(tt.name, func(t *testing.T) {
			text := s.text[tt.op]
			for _, want := range tt.contains {
				if !strings.Contains(text, want) {
					t.Errorf("missing %q in\n%s", want, text)
				}
			}
			for _, bad := range append(tt.absent, forbiddenClocks...) {
				if strings.Contains(strings.ToUpper(text), strings.ToUpper(bad)) {
					t.Errorf("contains %q:\n%s", bad, text)
				}
			}
			if strings.Contains(text, "{") {
				t.Errorf("a table placeholder is left:\n%s", text)
			}
		})
	}
	for o := range numOps {
		if !tested[o] {
			t.Errorf("operation %s has no statement test", routines[o].procedure)
		}
	}
	if strconv.Itoa(pruneBatch) != pruneBatchText {
		t.Errorf("pruneBatch %d, text %s", pruneBatch, pruneBatchText)
	}
	// Every statement undoes NOCOUNT, IMPLICIT_TRANSACTIONS and ROWCOUNT; every one that writes also
	// turns XACT_ABORT on and pins the isolation level, before anything else.
	for o, text := range s.text {
		if !strings.HasPrefix(text, "SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF; SET ROWCOUNT 0;\n") {
			t.Errorf("%s does not start with SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF; SET ROWCOUNT 0:\n%s", routines[o].procedure, text)
		}
		reads := op(o) == opRead || op(o) == opReadPayload || op(o) == opReadOperation
		xact := strings.HasPrefix(text, autocommit+"SET XACT_ABORT ON; SET TRANSACTION ISOLATION LEVEL READ COMMITTED;\n")
		if xact == reads {
			t.Errorf("%s: XACT_ABORT prefix %v, want %v:\n%s", routines[o].procedure, xact, !reads, text)
		}
		// A transaction the batch opens is committed by the batch, and the answer is read
		// before the COMMIT, so that no statement after it can fail.
		if strings.Contains(text, "BEGIN TRANSACTION;") && !strings.HasSuffix(text, "COMMIT TRANSACTION;") {
			t.Errorf("%s: BEGIN TRANSACTION without a final COMMIT:\n%s", routines[o].procedure, text)
		}
		// The incarnation is checked by exactly the lease-carrying operations, first after
		// the caller's prefixes (TestEveryResourceProcedureChecksPrefixes).
		carriesLease := op(o) == opAcquire || op(o) == opRenew || op(o) == opPublish ||
			op(o) == opPublishAndRelease || op(o) == opRelease
		if checked := strings.HasPrefix(text, autocommit+writes+s.names.Replace(prefixCheck)+incarnationVisible+"IF NOT EXISTS (SELECT 1 FROM [dbo].[fenced_meta]"); checked != carriesLease {
			t.Errorf("%s: incarnation checked first %v, want %v", routines[o].procedure, checked, carriesLease)
		}
	}
	// The raw baseline's acquisition is the driver's, without the explaining read.
	if !strings.Contains(s.text[opAcquire], lock+s.acquireUpdate+";\n") || strings.Contains(s.acquireUpdate, "IF ") {
		t.Errorf("acquireUpdate is not the acquisition of acquire:\n%s", s.acquireUpdate)
	}
}

// clockAfterLocks reports whether every statement of text that reads SYSUTCDATETIME() runs
// after the batch locked the resource's row (and, when it uses one, the operation id) inside
// the transaction that then commits: the check that a statement waiting on a lock cannot
// judge expiry by the instant before its wait.
func clockAfterLocks(text string) bool {
	begin := strings.Index(text, "BEGIN TRANSACTION;")
	row := strings.Index(text, "WITH (UPDLOCK, ROWLOCK) WHERE resource = @resource;")
	clock := strings.Index(text, "SYSUTCDATETIME()")
	if begin < 0 || row < begin || clock < row {
		return false
	}
	if strings.Contains(text, "@op_id") {
		opLock := strings.Index(text, "SELECT @absent = 0 FROM")
		return opLock > row && clock > opLock
	}
	return true
}

// TestExpiryIsJudgedAfterTheLocks: Acquire, Renew and both publications lock the row (and
// the operation id) before the statement that reads the clock. The statements as they were
// before (one conditional UPDATE that waits for the lock itself, having read the clock when
// it started) fail the same check.
func TestExpiryIsJudgedAfterTheLocks(t *testing.T) {
	s := newStatements("app")
	for _, o := range []op{opAcquire, opRenew, opPublish, opPublishAndRelease} {
		if !clockAfterLocks(s.text[o]) {
			t.Errorf("%s reads the clock before it holds its locks:\n%s", routines[o].procedure, s.text[o])
		}
	}
	oldRenew := autocommit + writes + "UPDATE [app].[fenced_resources]\nSET lease_until = " + leaseEnd +
		"\nOUTPUT TODATETIMEOFFSET(inserted.lease_until, 0)\nWHERE " + leaseMatches + " AND lease_until > SYSUTCDATETIME()"
	oldPublish := autocommit + writes + "DECLARE @rows INT;\nBEGIN TRANSACTION;\nUPDATE [app].[fenced_resources] SET " +
		"published_at = SYSUTCDATETIME() WHERE " + leaseMatches + " AND lease_until > SYSUTCDATETIME() AND NOT EXISTS " +
		"(SELECT 1 FROM [app].[fenced_operations] WITH (UPDLOCK, HOLDLOCK) WHERE op_id = @op_id);\nCOMMIT TRANSACTION;"
	for name, text := range map[string]string{"old renew": oldRenew, "old publish": oldPublish} {
		if clockAfterLocks(text) {
			t.Errorf("the check passes %s, which read the clock before its lock wait", name)
		}
	}
}

// TestEpochsStartFromTheEngineClock: the epoch a store sets is never below the engine's clock
// in microseconds since 1970, at creation (the first recorded incarnation) and at every bump.
func TestEpochsStartFromTheEngineClock(t *testing.T) {
	s := newStatements("app")
	if clockEpoch != "DATEDIFF_BIG(microsecond, CAST('19700101' AS DATETIME2(7)), SYSUTCDATETIME())" {
		t.Fatalf("clockEpoch = %s", clockEpoch)
	}
	for _, want := range []string{
		"SET epoch = CASE WHEN epoch < " + clockEpoch + " THEN " + clockEpoch + " ELSE epoch END",
		"recovery_fork_guid = (SELECT recovery_fork_guid FROM sys.database_recovery_status WHERE database_id = DB_ID())",
		"database_guid = (SELECT database_guid FROM sys.database_recovery_status WHERE database_id = DB_ID())",
		"WHERE id = 1 AND recovery_fork_guid IS NULL", "THROW 51802, ",
		"UPDATE [app].[fenced_meta]",
	} {
		if !strings.Contains(s.recordIncarnation, want) {
			t.Errorf("recordIncarnation lacks %q:\n%s", want, s.recordIncarnation)
		}
	}
	if !strings.Contains(s.text[opBumpEpoch], "epoch = CASE WHEN epoch + 1 > "+clockEpoch+" THEN epoch + 1 ELSE "+clockEpoch+" END") {
		t.Errorf("bump does not take max(epoch + 1, clock):\n%s", s.text[opBumpEpoch])
	}
	body, err := migrations.ReadFile("migrations/0003_incarnation.sql")
	if err != nil {
		t.Fatal(err)
	}
	if text := s.names.Replace(string(body)); !strings.Contains(text, "ALTER TABLE [app].[fenced_meta] ADD\n"+
		"    recovery_fork_guid UNIQUEIDENTIFIER NULL,\n    database_guid      UNIQUEIDENTIFIER NULL;") {
		t.Errorf("migration 3:\n%s", text)
	}
}

// TestRoutineParametersMatchTheirStatements: every parameter a statement uses is declared by
// its procedure and sent by the driver, and the other way round, so that the procedure Grant
// installs runs exactly the driver's statement.
func TestRoutineParametersMatchTheirStatements(t *testing.T) {
	param := regexp.MustCompile(`@([a-z_]+)`)
	l := driver.LeaseRef{Resource: "r", Owner: "o", Epoch: 1, Generation: 1}
	acq, _ := acquireArgs("r", "o", time.Second)
	ren, _ := renewArgs(l, time.Second)
	prn, _ := pruneArgs(time.Second)
	sent := [numOps][]any{
		opProvision: resourceArgs("r"), opAcquire: acq, opRenew: ren,
		opPublish: publishArgs(l, driver.Publication{}), opPublishAndRelease: publishArgs(l, driver.Publication{}),
		opRelease: leaseArgs(l), opRead: resourceArgs("r"), opReadPayload: resourceArgs("r"),
		opResolve: opArgs("x"), opReadOperation: opArgs("x"), opBumpEpoch: nil, opPrune: prn,
	}
	for o, rt := range routines {
		declared := map[string]bool{}
		for _, m := range param.FindAllStringSubmatch(rt.params, -1) {
			declared[m[1]] = true
		}
		used := map[string]bool{}
		local := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?:DECLARE|,) @([a-z_]+) [A-Z]`).FindAllStringSubmatch(rt.text, -1) {
			local[m[1]] = true
		}
		for _, m := range param.FindAllStringSubmatch(rt.text, -1) {
			if !local[m[1]] {
				used[m[1]] = true
			}
		}
		args := map[string]bool{}
		for _, a := range sent[o] {
			args[a.(sql.NamedArg).Name] = true
		}
		if !reflect.DeepEqual(declared, used) || !reflect.DeepEqual(declared, args) {
			t.Errorf("%s: declared %v, used %v, sent %v", rt.procedure, declared, used, args)
		}
	}
}

func TestProceduresAreTheStatements(t *testing.T) {
	s := newStatements("app_locks")
	seen := map[string]bool{}
	for o, rt := range routines {
		head := "CREATE OR ALTER PROCEDURE [app_locks].[" + rt.procedure + "]"
		if rt.params != "" {
			head += "\n    " + rt.params
		}
		head += "\nAS\nBEGIN\n"
		sum := sha256.Sum256([]byte(head + s.text[o]))
		fp := "fenced:" + hex.EncodeToString(sum[:16])
		if want := head + "-- " + fp + "\n" + s.text[o] + "\nEND"; s.create[o] != want || s.fingerprint[o] != fp {
			t.Errorf("%s:\n%s\nwant\n%s", rt.procedure, s.create[o], want)
		}
		if seen[fp] {
			t.Errorf("%s: fingerprint %s is not unique", rt.procedure, fp)
		}
		seen[fp] = true
		if s.procedure[o] != "[app_locks].["+rt.procedure+"]" {
			t.Errorf("procedure name %s", s.procedure[o])
		}
		if strings.Contains(s.create[o], "EXECUTE AS") || strings.Contains(s.create[o], "sp_executesql") {
			t.Errorf("%s impersonates or uses dynamic SQL, which breaks the ownership chain", rt.procedure)
		}
		// go-mssqldb calls a name as a procedure (an RPC with typed parameters) only when the
		// text has no space, newline, quote or semicolon outside brackets (isProc in mssql.go).
		if strings.ContainsAny(s.procedure[o], " \n\r';") {
			t.Errorf("%s would be sent as a batch, not called", s.procedure[o])
		}
		// The fingerprint changes with the body: an upgraded statement replaces the procedure.
		if _, other := createProcedure(s.procedure[o], rt.params, s.text[o]+" "); other == fp {
			t.Errorf("%s: the fingerprint does not depend on the body", rt.procedure)
		}
	}
	if got := s.create[opRelease]; !strings.HasPrefix(got, "CREATE OR ALTER PROCEDURE [app_locks].[fenced_release]\n"+
		"    @resource NVARCHAR(4000), @owner NVARCHAR(4000), @generation BIGINT, @epoch BIGINT\nAS\nBEGIN\n-- fenced:") {
		t.Errorf("release procedure:\n%s", got)
	}
	if got := s.create[opBumpEpoch]; !strings.HasPrefix(got, "CREATE OR ALTER PROCEDURE [app_locks].[fenced_bump_epoch]\nAS\nBEGIN\n") {
		t.Errorf("bump procedure:\n%s", got)
	}
	// Migrate finds the stale procedures by their fingerprints.
	for o := range numOps {
		want := fmt.Sprintf("(%d, N'%s', N'%s')", o, s.procedure[o], s.fingerprint[o])
		if !strings.Contains(s.staleProcedures, want) {
			t.Errorf("staleProcedures lacks %s", want)
		}
	}
	if !strings.Contains(s.staleProcedures, "WHERE CHARINDEX(fp, COALESCE(OBJECT_DEFINITION(OBJECT_ID(name, N'P')), N'')) = 0") {
		t.Errorf("staleProcedures:\n%s", s.staleProcedures)
	}
}

func TestLeaseEndSplitsTheTTL(t *testing.T) {
	// DATEADD(microsecond, ...) only ever receives the sub-second part.
	want := "DATEADD(second, @ttl_s, DATEADD(microsecond, @ttl_us, SYSUTCDATETIME()))"
	if leaseEnd != want {
		t.Fatalf("leaseEnd = %s, want %s", leaseEnd, want)
	}
}

func TestStatementsUseTheSchema(t *testing.T) {
	s := newStatements("fenced_t1")
	all := append(s.text[:], s.create[:]...)
	all = append(all, s.createMigrations, s.schemaVersion, s.recordMigration)
	for _, text := range all {
		if strings.Contains(text, "[dbo]") || strings.Contains(text, "{") {
			t.Errorf("schema not substituted:\n%s", text)
		}
		if !strings.Contains(text, "[fenced_t1].[fenced_") {
			t.Errorf("no [fenced_t1] table in:\n%s", text)
		}
	}
	if !strings.Contains(s.createMigrations, "OBJECT_ID(N'[fenced_t1].[fenced_schema_migrations]', N'U')") {
		t.Errorf("createMigrations: %s", s.createMigrations)
	}
}

func TestMigrationsCompareExactly(t *testing.T) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	body, err := migrations.ReadFile("migrations/0001_create_resources.sql")
	if err != nil {
		t.Fatal(err)
	}
	text := newStatements("s1").names.Replace(string(body))
	for _, want := range []string{
		"CREATE TABLE [s1].[fenced_resources]",
		"resource             NVARCHAR(255) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY",
		"lease_owner          NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NULL",
		"generation           BIGINT         NOT NULL DEFAULT 0",
		"lease_until          DATETIME2(7)   NULL",
		"published_generation BIGINT         NOT NULL DEFAULT 0",
		"payload              VARBINARY(MAX) NULL",
		"published_at         DATETIME2(7)   NULL",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("migration lacks %q", want)
		}
	}
	if strings.Contains(text, "{") {
		t.Errorf("a placeholder is left in the migration")
	}
	// One batch: go-mssqldb sends the file as it is, and GO is a client-side separator.
	for _, line := range strings.Split(text, "\n") {
		if strings.EqualFold(strings.TrimSpace(line), "GO") {
			t.Errorf("migration contains a GO separator")
		}
	}
}

func TestSplitTTL(t *testing.T) {
	tests := []struct {
		ttl     time.Duration
		s, us   int32
		wantErr bool
	}{
		{time.Microsecond, 0, 1, false},
		{time.Second, 1, 0, false},
		{1500 * time.Millisecond, 1, 500000, false},
		{time.Second - time.Microsecond, 0, 999999, false},
		{time.Second + 1234567*time.Nanosecond, 1, 1234, false}, // below a microsecond is dropped
		// 2^31 µs is about 35m47s: past it, a TTL in microseconds would overflow DATEADD's INT.
		{35*time.Minute + 48*time.Second, 2148, 0, false},
		{time.Hour, 3600, 0, false},
		{366 * 24 * time.Hour, 31622400, 0, false},
		{math.MaxInt32 * time.Second, math.MaxInt32, 0, false},
		{time.Duration(math.MaxInt64), 0, 0, true},
		{(math.MaxInt32 + 1) * time.Second, 0, 0, true},
		{0, 0, 0, true},
		{-time.Second, 0, 0, true},
		{999 * time.Nanosecond, 0, 0, true},
	}
	for _, tt := range tests {
		s, us, err := splitTTL(tt.ttl)
		if (err != nil) != tt.wantErr || s != tt.s || us != tt.us {
			t.Errorf("splitTTL(%s) = %d, %d, %v; want %d, %d, error %v", tt.ttl, s, us, err, tt.s, tt.us, tt.wantErr)
		}
		if err == nil && time.Duration(s)*time.Second+time.Duration(us)*time.Microsecond != tt.ttl.Truncate(time.Microsecond) {
			t.Errorf("splitTTL(%s) does not add up: %d s + %d µs", tt.ttl, s, us)
		}
	}
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		url, dsn, schema, err string
	}{
		{url: "sqlserver://sa:pw@localhost:1433?database=fenced",
			dsn: "sqlserver://sa:pw@localhost:1433?database=fenced"},
		{url: "sqlserver://sa:pw@db.example:1433?database=app&schema=fenced&encrypt=true",
			dsn: "sqlserver://sa:pw@db.example:1433?database=app&encrypt=true", schema: "fenced"},
		{url: "sqlserver://sa@localhost/SQLEXPRESS?database=x", dsn: "sqlserver://sa@localhost/SQLEXPRESS?database=x"},
		{url: "postgres://u:p@localhost/db", err: `scheme "postgres" is not sqlserver://`},
		{url: "sqlserver:///?database=x", err: "no host"},
		{url: "sqlserver://sa:pw@localhost?schema=a;drop", err: "query is malformed"},
		{url: "sqlserver://sa:pw@localhost?schema=a%5Db", err: "not a plain identifier"},
		{url: "sqlserver://sa:pw@localhost?schema=a&schema=b", err: "more than once"},
		{url: "sqlserver://sa:secret@local host:1433", err: "not a valid URL"},
	}
	for _, tt := range tests {
		dsn, cfg, err := parseURL(tt.url)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseURL(%q) error %v, want %q", tt.url, err, tt.err)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("parseURL(%q) error shows the password: %v", tt.url, err)
			}
			continue
		}
		if err != nil || dsn != tt.dsn || cfg.Schema != tt.schema {
			t.Errorf("parseURL(%q) = %q, %q, %v; want %q, %q", tt.url, dsn, cfg.Schema, err, tt.dsn, tt.schema)
		}
	}
	d, err := Open("sqlserver://sa:pw@localhost:1433?database=fenced&schema=app_locks")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Schema() != "app_locks" || !d.owned {
		t.Fatalf("Open: schema %q owned %v", d.Schema(), d.owned)
	}
	if _, err := Open("sqlserver://sa:pw@localhost:1433?database=fenced&connection+timeout=abc"); err == nil {
		t.Fatal("Open accepted a bad go-mssqldb parameter")
	}
}

func TestConfig(t *testing.T) {
	for _, bad := range []string{"1abc", "a-b", "a]b", "a b", strings.Repeat("x", 129)} {
		if _, err := NewWithConfig(nil, &Config{Schema: bad}); err == nil {
			t.Errorf("schema %q accepted", bad)
		}
	}
	if d := New(nil); d.Schema() != "dbo" {
		t.Fatalf("default schema %q", d.Schema())
	}
}

// FuzzParseURL: parseURL never panics, never quotes a password in an error, and what it
// accepts is a sqlserver:// URL without fenced's own parameter and with a valid schema.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"sqlserver://sa:pw@localhost:1433?database=x&schema=s",
		"sqlserver://sa:pw@h?schema=", "sqlserver://h/inst?database=a%20b", "mysql://x", "%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		dsn, cfg, err := parseURL(raw)
		if err != nil {
			if u, perr := url.Parse(raw); perr == nil && u.User != nil {
				if p, ok := u.User.Password(); ok && len(p) > 3 && strings.Contains(err.Error(), p) {
					t.Fatalf("error quotes the password: %v", err)
				}
			}
			return
		}
		u, err := url.Parse(dsn)
		if err != nil || u.Scheme != "sqlserver" || u.Query().Has("schema") {
			t.Fatalf("parseURL(%q) = %q, %v", raw, dsn, err)
		}
		if _, err := cfg.withDefaults(); err != nil {
			t.Fatalf("parseURL(%q) accepted schema %q", raw, cfg.Schema)
		}
	})
}
