package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/PID/stat (USER_HZ). Linux
// fixes it at 100 for user space on every architecture it supports.
const clockTicks = 100

const sqlServerProcess = `SELECT pg_backend_pid(),
       coalesce(array_agg(a.pid) FILTER (WHERE a.backend_type IN ('checkpointer', 'background writer', 'walwriter')), '{}')
FROM pg_stat_activity a`

// serverCPU reads the CPU time spent by a PostgreSQL server running on this
// machine: its postmaster and every process it started, live or ended.
type serverCPU struct {
	postmaster int
}

// findServerCPU finds the postmaster of the server behind the bench's pool
// in /proc: the parent of a backend, checked to be the parent of the
// server's own checkpointer and writers too, so that a server on another
// machine (or in another PID namespace) is never taken for a local process
// that happens to have that PID. (Start times cannot tell: the wall clock
// that PostgreSQL stamps them with and the boot time that /proc counts from
// drift apart by seconds on a virtual machine.)
func (b *Bench) findServerCPU(ctx context.Context) (*serverCPU, error) {
	var backend int
	var aux []int
	if err := b.pool.QueryRow(ctx, sqlServerProcess).Scan(&backend, &aux); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	st, err := readStat(backend)
	if err != nil {
		return nil, fmt.Errorf("bench: the server's CPU is read from /proc, and its backend %d is not a process here "+
			"(run the benchmark on the database's machine): %w", backend, err)
	}
	if len(aux) == 0 {
		return nil, fmt.Errorf("bench: pg_stat_activity shows none of the server's checkpointer and writers")
	}
	for _, pid := range aux {
		a, err := readStat(pid)
		if err != nil || a.ppid != st.ppid {
			return nil, fmt.Errorf("bench: process %d, the parent of backend %d, is not the parent of the server's "+
				"process %d: it is not the server's postmaster (run the benchmark on the database's machine)", st.ppid, backend, pid)
		}
	}
	return &serverCPU{postmaster: st.ppid}, nil
}

// total is the CPU time of the postmaster, of its children that ended (which
// it has waited for) and of those alive now. A child the postmaster waits for
// during the walk through /proc moves from the live ones to its parent's
// count, and may be seen in neither or in both; so the walk is taken again
// until the postmaster's count of its ended children is the same on both
// sides of it.
func (s *serverCPU) total() (time.Duration, error) {
	for range 1000 {
		pm, err := readStat(s.postmaster)
		if err != nil {
			return 0, fmt.Errorf("bench: the server's postmaster: %w", err)
		}
		live, err := s.children()
		if err != nil {
			return 0, err
		}
		pm2, err := readStat(s.postmaster)
		if err != nil {
			return 0, fmt.Errorf("bench: the server's postmaster: %w", err)
		}
		if pm2.cutime == pm.cutime && pm2.cstime == pm.cstime {
			ticks := pm.utime + pm.stime + pm.cutime + pm.cstime + live
			return time.Duration(ticks) * time.Second / clockTicks, nil
		}
	}
	return 0, errors.New("bench: the server's backends end faster than its processes can be read")
}

// children is the CPU time, in clock ticks, of the postmaster's children
// alive now (or ended and not yet waited for).
func (s *serverCPU) children() (int64, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	var ticks int64
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != s.postmaster {
			continue // gone meanwhile, or not the server's
		}
		ticks += st.utime + st.stime
	}
	return ticks, nil
}

// procStat holds the fields of /proc/PID/stat the bench reads, in clock ticks.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// The command name, in parentheses, may hold spaces: the fields follow its last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 15 {
		return procStat{}, errors.New("short /proc stat")
	}
	num := func(n int) int64 {
		v, _ := strconv.ParseInt(f[n-3], 10, 64)
		return v
	}
	return procStat{ppid: int(num(4)), utime: num(14), stime: num(15), cutime: num(16), cstime: num(17)}, nil
}

// selfCPU is the CPU time of this process so far: the worker runtime, and
// the benchmark's own producer beside it.
func selfCPU() time.Duration { return rusageCPU(syscall.RUSAGE_SELF) }

// childrenCPU is the CPU time of this process's children that ended and were
// waited for: the backend programs the pipeline ran.
func childrenCPU() time.Duration { return rusageCPU(syscall.RUSAGE_CHILDREN) }

func rusageCPU(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the CPU time of all of the machine's CPUs since boot, busy
// and idle, from /proc/stat; ok is false where it cannot be read.
func machineCPU() (busy, idle time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseCPULine(line)
}

// parseCPULine reads /proc/stat's first line: "cpu" and the times in clock
// ticks of user, nice, system, idle, iowait, irq, softirq, steal, and on
// newer kernels guest and guest_nice, which user and nice already hold.
// Busy is user, nice, system and the interrupts: not steal, the time a
// hypervisor ran something else. Idle is idle and iowait.
func parseCPULine(line string) (busy, idle time.Duration, ok bool) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	var t [8]int64
	for i := range t {
		var err error
		if t[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, false
		}
	}
	tick := time.Second / clockTicks
	busy = time.Duration(t[0]+t[1]+t[2]+t[5]+t[6]) * tick
	idle = time.Duration(t[3]+t[4]) * tick
	return busy, idle, true
}

// cpuSpan measures the CPU time of the server and of this process from its
// start; server is nil when the server is not on this machine.
type cpuSpan struct {
	server       *serverCPU
	serverBefore time.Duration
	selfBefore   time.Duration
}

// startCPU starts a cpuSpan. A server it cannot read (on another machine, or
// in another PID namespace) is logged and left out.
func (b *Bench) startCPU(ctx context.Context) *cpuSpan {
	s := &cpuSpan{selfBefore: selfCPU()}
	s.server, s.serverBefore = b.localServer(ctx)
	return s
}

// localServer finds the server's processes and reads their CPU time so far.
// A server it cannot read (on another machine, or in another PID namespace)
// is logged, and localServer returns nil.
func (b *Bench) localServer(ctx context.Context) (*serverCPU, time.Duration) {
	server, err := b.findServerCPU(ctx)
	var t time.Duration
	if err == nil {
		t, err = server.total()
	}
	if err != nil {
		b.logger.Info("bench: the server's CPU is left out", "err", err)
		return nil, 0
	}
	return server, t
}

// perRow is the CPU time since the start, in milliseconds per row, of the
// server (0 when it is left out) and of this process.
func (s *cpuSpan) perRow(rows int) (server, self float64) {
	n := float64(max(rows, 1))
	self = round(ms(selfCPU()-s.selfBefore)/n, 4)
	if s.server == nil {
		return 0, self
	}
	after, err := s.server.total()
	if err != nil {
		return 0, self
	}
	return round(ms(after-s.serverBefore)/n, 4), self
}
