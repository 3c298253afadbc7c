package sqlserver

import (
	"io/fs"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"
)

// forbiddenClocks are clock functions that must never judge or stamp a lease: they follow the
// server's time zone, or have DATETIME's 3 ms resolution.
var forbiddenClocks = []string{"GETDATE", "CURRENT_TIMESTAMP", "SYSDATETIME(", "GETUTCDATE",
	"SYSDATETIMEOFFSET", "NOW("}

func TestStatementsHoldTheProtocolConditions(t *testing.T) {
	s := newStatements(DefaultSchema)
	lease := []string{"resource = @resource", "lease_owner = @owner", "generation = @generation"}
	live := "lease_until > SYSUTCDATETIME()"
	unpublished := "published_generation < @generation"
	tests := []struct {
		name     string
		text     string
		contains []string
		absent   []string
	}{
		{"provision", s.provision, []string{"INSERT INTO [dbo].[fenced_resources] (resource)",
			"WHERE NOT EXISTS", "WITH (UPDLOCK, HOLDLOCK) WHERE resource = @resource"}, []string{"UPDATE", "MERGE"}},
		{"acquire", s.acquire, []string{"UPDATE [dbo].[fenced_resources]", "SET generation = generation + 1",
			"lease_owner = @owner", "OUTPUT inserted.generation, TODATETIMEOFFSET(inserted.lease_until, 0), 1 AS acquired",
			"WHERE resource = @resource AND (lease_until IS NULL OR lease_until <= SYSUTCDATETIME())",
			"lease_until = " + leaseEnd, "IF @@ROWCOUNT = 0",
			"SELECT generation, TODATETIMEOFFSET(lease_until, 0), 0 AS acquired FROM [dbo].[fenced_resources] WHERE resource = @resource"}, []string{"@generation"}},
		{"renew", s.renew, append([]string{"SET lease_until = " + leaseEnd,
			"OUTPUT TODATETIMEOFFSET(inserted.lease_until, 0)", live}, lease...), []string{"generation + 1"}},
		{"publish", s.publish, append([]string{"payload = @payload",
			"published_generation = @generation", "published_at = SYSUTCDATETIME()", live, unpublished}, lease...),
			[]string{"lease_owner = NULL"}},
		{"publish and release", s.publishAndRelease, append([]string{"payload = @payload",
			"published_generation = @generation", "lease_owner = NULL, lease_until = NULL", live, unpublished}, lease...), nil},
		{"release", s.release, append([]string{"SET lease_owner = NULL, lease_until = NULL"}, lease...),
			[]string{"payload", "generation + 1"}},
		{"read", s.read, []string{"TODATETIMEOFFSET(lease_until, 0)", "TODATETIMEOFFSET(published_at, 0)",
			"TODATETIMEOFFSET(SYSUTCDATETIME(), 0)", "DATALENGTH(payload)", "WHERE resource = @resource"}, nil},
		{"read payload", s.readPayload, []string{"published_generation, payload", "WHERE resource = @resource"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, want := range tt.contains {
				if !strings.Contains(tt.text, want) {
					t.Errorf("missing %q in\n%s", want, tt.text)
				}
			}
			for _, bad := range append(tt.absent, forbiddenClocks...) {
				if strings.Contains(strings.ToUpper(tt.text), strings.ToUpper(bad)) {
					t.Errorf("contains %q:\n%s", bad, tt.text)
				}
			}
			if strings.Contains(tt.text, "{") {
				t.Errorf("a table placeholder is left:\n%s", tt.text)
			}
		})
	}
	// Every change commits by itself and reports its row count, whatever the session's settings.
	for _, text := range []string{s.provision, s.acquire, s.renew, s.publish, s.publishAndRelease, s.release,
		s.read, s.readPayload} {
		if !strings.HasPrefix(text, "SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF;\n") {
			t.Errorf("does not start with SET NOCOUNT OFF; SET IMPLICIT_TRANSACTIONS OFF:\n%s", text)
		}
	}
	// The raw baseline's acquisition is the driver's, without the explaining read.
	if !strings.HasPrefix(s.acquire, autocommit+s.acquireUpdate+";\n") || strings.Contains(s.acquireUpdate, "SELECT") {
		t.Errorf("acquireUpdate is not the first statement of acquire:\n%s", s.acquireUpdate)
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
	all := []string{s.provision, s.acquire, s.renew, s.publish, s.publishAndRelease, s.release,
		s.read, s.readPayload, s.createMigrations, s.schemaVersion, s.recordMigration}
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
