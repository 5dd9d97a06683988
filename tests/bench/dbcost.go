package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// dbCost is what the database spent on a round (or, per event, on an
// event): the WAL it wrote, and the CPU time of PostgreSQL's processes
// when the server runs on this machine. Both are counted over the whole
// round, warm-up included, and divided by every operation the round
// completed, so that work done after an operation's answer (River's
// completions, checkpoints of the round's writes) is counted too. WAL
// bytes hardly depend on the machine's load; the CPU time does, less than
// the rates do.
type dbCost struct {
	WAL   float64 // bytes
	CPU   float64 // milliseconds
	HasDB bool    // WAL was measured
	HasPG bool    // PostgreSQL's CPU was measured
}

func (a dbCost) add(b dbCost) dbCost {
	if !b.HasDB {
		return a
	}
	a.HasDB = true
	a.WAL += b.WAL
	if b.HasPG {
		a.HasPG = true
		a.CPU += b.CPU
	}
	return a
}

// per returns the cost per operation of n operations.
func (a dbCost) per(n int64) dbCost {
	if n == 0 {
		return dbCost{}
	}
	a.WAL /= float64(n)
	a.CPU /= float64(n)
	return a
}

// dbProbe reads the server's WAL position and, when PostgreSQL runs on this
// machine and its processes can be read, their CPU time.
type dbProbe struct {
	conn *pgx.Conn
	// postmaster is PostgreSQL's postmaster process, 0 when its processes
	// cannot be read here.
	postmaster int
}

// dbCounters are the probe's counters at one moment.
type dbCounters struct {
	wal int64
	cpu time.Duration // -1 when unknown
}

// newDBProbe connects to dbURL. The postmaster is found as the parent of
// the server's checkpointer.
func newDBProbe(ctx context.Context, dbURL string) (*dbProbe, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	p := &dbProbe{conn: conn}
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").Scan(&pid); err == nil {
		if ppid, ok := parentOf(pid); ok && procCPU(ppid) > 0 {
			p.postmaster = ppid
		}
	}
	if p.postmaster == 0 {
		logf("PostgreSQL's processes are not readable here: no PostgreSQL CPU per event")
	}
	return p, nil
}

func (p *dbProbe) close() { p.conn.Close(context.Background()) }

func (p *dbProbe) read(ctx context.Context) (dbCounters, error) {
	c := dbCounters{cpu: -1}
	var wal string
	if err := p.conn.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0')::text").Scan(&wal); err != nil {
		return c, fmt.Errorf("read WAL position: %w", err)
	}
	v, err := strconv.ParseFloat(wal, 64)
	if err != nil {
		return c, fmt.Errorf("read WAL position %q: %w", wal, err)
	}
	c.wal = int64(v)
	if p.postmaster != 0 {
		c.cpu = postgresCPU(p.postmaster)
	}
	return c, nil
}

// between returns the cost between two readings.
func between(a, b dbCounters) dbCost {
	d := dbCost{WAL: float64(b.wal - a.wal), HasDB: true}
	if a.cpu >= 0 && b.cpu >= 0 {
		d.CPU, d.HasPG = float64(b.cpu-a.cpu)/float64(time.Millisecond), true
	}
	return d
}

// postgresCPU returns the CPU time of the postmaster pm, of its live child
// processes (backends, background workers) and of the children it has
// reaped (backends that ended: a pgbench run's). A child that ends while
// the processes are read, or has ended and is not reaped yet (its times
// are no longer shown), would be missed: the reading is taken again then.
func postgresCPU(pm int) time.Duration {
	var total time.Duration
	for range 20 {
		before := procCPUWithChildren(pm)
		total = before
		consistent := true
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == pm {
				continue
			}
			f := statFields(pid)
			if len(f) < 13 || f[1] != strconv.Itoa(pm) {
				continue
			}
			if f[0] == "Z" {
				consistent = false
				break
			}
			total += procCPU(pid)
		}
		if consistent && procCPUWithChildren(pm) == before {
			return total
		}
		time.Sleep(5 * time.Millisecond)
	}
	return total
}

// statFields returns the fields of /proc/<pid>/stat after the command name.
func statFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

func parentOf(pid int) (int, bool) {
	f := statFields(pid)
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// procCPUWithChildren is procCPU plus the CPU time of the children the
// process has reaped.
func procCPUWithChildren(pid int) time.Duration {
	f := statFields(pid)
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, v := range f[11:15] { // utime, stime, cutime, cstime
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * clockTick
}

// walShare is the WAL a round wrote to one relation (or, for records that
// change no relation's pages, of one kind: commits, for one), in bytes per
// event of the round, full-page images included.
type walShare struct {
	Rel   string
	Bytes float64
}

// walByRelation reads, with pg_walinspect, the WAL between two readings
// by relation, per event of the n the round completed, largest first (up
// to what the server has flushed: pg_walinspect reads no further; every
// commit is flushed, so only background records can be left out). It
// returns nil when the extension cannot be had.
func (p *dbProbe) walByRelation(ctx context.Context, a, b dbCounters, n int64) []walShare {
	if n == 0 {
		return nil
	}
	if b.wal <= a.wal {
		return []walShare{} // measured: none (pg_walinspect refuses an empty range)
	}
	if _, err := p.conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		logf("WAL by relation: %v", err)
		return nil
	}
	// Records written without a commit of their own (hint bits, a
	// checkpoint's) reach the disk within the WAL writer's delay.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var flushed float64
		if err := p.conn.QueryRow(ctx, "SELECT (pg_current_wal_flush_lsn() - '0/0')::float8").Scan(&flushed); err != nil {
			logf("WAL by relation: %v", err)
			return nil
		}
		if int64(flushed) > a.wal && int64(flushed) >= b.wal {
			break
		}
	}
	rows, err := p.conn.Query(ctx, `
		WITH r AS (
			SELECT substring(block_ref FROM 'rel \d+/\d+/(\d+)')::oid AS fn, resource_manager AS rm, record_length
			FROM pg_get_wal_records_info(('0/0'::pg_lsn + $1::numeric),
				least('0/0'::pg_lsn + $2::numeric, pg_current_wal_flush_lsn()))
		)
		SELECT coalesce(pg_filenode_relation(0, fn)::text, fn::text, '(' || rm || ')'), sum(record_length)::float8 / $3
		FROM r GROUP BY 1 ORDER BY 2 DESC`, a.wal, b.wal, n)
	if err != nil {
		logf("WAL by relation: %v", err)
		return nil
	}
	shares, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (walShare, error) {
		var s walShare
		err := row.Scan(&s.Rel, &s.Bytes)
		return s, err
	})
	if err != nil {
		logf("WAL by relation: %v", err)
		return nil
	}
	if shares == nil {
		shares = []walShare{} // measured: none
	}
	return shares
}
