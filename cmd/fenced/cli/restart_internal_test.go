package cli

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// restartEvent runs the restart fault on drv with restart in place of the server's restart,
// and returns the event it recorded.
func restartEvent(t *testing.T, drv driver.Driver, restart restartFunc) torture.Record {
	t.Helper()
	dir := t.TempDir()
	rec, err := torture.NewRecorder(dir+"/nemesis.jsonl", "nemesis")
	if err != nil {
		t.Fatal(err)
	}
	run := &tortureRun{drv: drv, restart: restart, nem: rec}
	run.restartFault(context.Background())
	_ = rec.Close()
	h, err := torture.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Events) != 1 || h.Events[0].Event != torture.FaultRestart {
		t.Fatalf("events %+v, want one restart", h.Events)
	}
	return h.Events[0]
}

// A restart whose command failed, or that reported success while the server's start
// (PostgreSQL's postmaster start time, Redis's run id) stayed the same, is recorded with an
// error, so that the report counts it as failed rather than injected; a Redis that really
// restarted is recorded without one, with its self-bump.
func TestRestartFaultConfirmsTheRestart(t *testing.T) {
	pgURL := drivertest.ServerURL(t, "FENCED_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", func(u string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			return err
		}
		return c.Close(ctx)
	})
	pg, err := postgres.Open(context.Background(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rd, port := ownRedis(t)
	defer rd.Close()

	noop := func(context.Context) error { return nil }
	failing := func(context.Context) error { return errors.New("restart postgresql: exit status 1: permission denied") }
	for _, tc := range []struct {
		name    string
		drv     driver.Driver
		restart restartFunc
		wantErr string
	}{
		{"postgres failed", pg, failing, "permission denied"},
		{"postgres not restarted", pg, noop, "did not restart"},
		{"redis not restarted", rd, noop, "did not restart"},
		{"redis restarted", rd, port.restart, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := restartEvent(t, tc.drv, tc.restart)
			if tc.wantErr == "" {
				if e.Err != "" || !e.SelfBump {
					t.Errorf("err %q, self bump %v: want a landed restart with its self-bump", e.Err, e.SelfBump)
				}
				return
			}
			if !strings.Contains(e.Err, tc.wantErr) || e.SelfBump {
				t.Errorf("err %q, self bump %v: want an error with %q and no self-bump", e.Err, e.SelfBump, tc.wantErr)
			}
		})
	}
}

// redisServer is a redis-server of the test's own on a free loopback port.
type redisServer struct {
	port string
	cmd  *exec.Cmd
}

func (s *redisServer) start() error {
	s.cmd = exec.Command("redis-server", "--port", s.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := s.cmd.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return waitPort(ctx, "127.0.0.1:"+s.port, true)
}

// restart kills the server and starts it again: a new run id.
func (s *redisServer) restart(context.Context) error {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	return s.start()
}

// ownRedis starts a redis-server of the test's own (skipping without one) and opens it.
func ownRedis(t *testing.T) (*redis.Driver, *redisServer) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("needs redis-server on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	s := &redisServer{port: port}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() })
	d, err := redis.Open("redis://127.0.0.1:" + port + "/0")
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}
