package postgres

import (
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// TestGrantRefusesRightsThroughMemberships: Grant revokes the role's own rights and PUBLIC's,
// but a role keeps what its memberships give it (pg_write_all_data, an application's group
// role), and a store connected as a role that may write fenced_resources sends bare
// statements. Grant refuses such a role, names the right and the membership it comes from,
// and changes nothing; a role whose level excludes a routine it may still execute through a
// membership is refused too, and so are a superuser and a role with CREATEROLE (before
// PostgreSQL 16 it may make itself a member of the tables' owner).
func TestGrantRefusesRightsThroughMemberships(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rawURL := testSchema(t, nil)
	owner := openDriver(t, rawURL)
	ownerStore, err := fenced.New(ctx, owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ownerStore.Grant(ctx, testRole(t, owner), nil); err != nil { // installs the routines
		t.Fatalf("grant to a clean role: %v", err)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := owner.Pool().Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	reader := &fenced.GrantOptions{Access: driver.AccessReader}
	for _, c := range []struct {
		name  string
		setup func(role, group string) // group: another role, made for the case
		opts  *fenced.GrantOptions
		words []string
	}{
		{"pg_write_all_data", func(role, _ string) { exec("GRANT pg_write_all_data TO " + role) },
			nil, []string{"INSERT", "fenced_", "pg_write_all_data"}},
		{"a group's UPDATE", func(role, group string) {
			exec("GRANT UPDATE ON fenced_resources TO " + group)
			exec("GRANT " + group + " TO " + role)
		}, nil, []string{"UPDATE", "fenced_resources", "group"}},
		{"a group's group's column", func(role, group string) {
			inner := testRole(t, owner)
			exec("GRANT UPDATE (epoch) ON fenced_meta TO " + inner)
			exec("GRANT " + inner + " TO " + group)
			exec("GRANT " + group + " TO " + role)
		}, nil, []string{"UPDATE", "fenced_meta"}},
		{"a group's TRIGGER, not inherited", func(role, group string) {
			exec("GRANT TRIGGER ON fenced_resources TO " + group)
			exec("GRANT " + group + " TO " + role)
			exec("ALTER ROLE " + role + " NOINHERIT") // it can still SET ROLE
		}, nil, []string{"TRIGGER", "fenced_resources", "group"}},
		{"CREATEROLE", func(role, _ string) { exec("ALTER ROLE " + role + " CREATEROLE") },
			nil, []string{"CREATEROLE", "member of the owner"}},
		{"superuser", func(role, _ string) { exec("ALTER ROLE " + role + " SUPERUSER") },
			nil, []string{"superuser"}},
		{"a reader with a group's EXECUTE", func(role, group string) {
			exec("GRANT EXECUTE ON FUNCTION " + rtAcquire.signature() + " TO " + group)
			exec("GRANT " + group + " TO " + role)
		}, reader, []string{"EXECUTE", "fenced_acquire", "reader", "group"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			role, group := testRole(t, owner), testRole(t, owner)
			c.setup(role, group)
			err := ownerStore.Grant(ctx, role, c.opts)
			if err == nil {
				t.Fatalf("grant to %s succeeded, want a refusal saying %q", role, c.words)
			}
			t.Log(err)
			for _, w := range append(c.words, role) {
				if w == "group" {
					w = group
				}
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			var granted bool
			if err := owner.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM fenced_grants WHERE role = $1)`, role).Scan(&granted); err != nil {
				t.Fatal(err)
			}
			if granted {
				t.Errorf("the refused grant recorded prefixes for %s", role)
			}
		})
	}
}
