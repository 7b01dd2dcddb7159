package backend

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HideProcess makes the calling process undumpable: a program running as
// the same user can then no longer open its /proc/PID/environ or
// /proc/PID/mem, follow its /proc/PID/fd links, or ptrace it. The worker's
// environment holds the database URL and the object store's keys; call
// HideProcess before starting any program.
//
// /proc/PID/cmdline stays readable by every user of the machine whatever the
// process does: secrets belong in the environment, never in flags.
func HideProcess() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}

// The process-wide state of the orphan reaper (see BecomeSubreaper).
var (
	subreaper atomic.Bool
	// programsMu is held for reading while a Runner starts a program and
	// records its pid, and for writing while orphans are looked for, so that
	// a program that exits at once is never taken for an orphan.
	programsMu sync.RWMutex
	pidsMu     sync.Mutex
	programs   = map[int]bool{} // pids of running programs, guarded by pidsMu
	// sweepMu serializes the sweeps.
	sweepMu sync.Mutex
)

// BecomeSubreaper makes the calling process the child subreaper of every
// program a Runner starts (PR_SET_CHILD_SUBREAPER): a process that a
// program leaves behind in a new session (setsid, a daemon's double fork)
// becomes a child of this process when its parent exits, instead of going
// to init. From then on each Run ends by killing the processes its run left
// behind (they carry the run's PGWORKER_RUN_ID), and KillOrphans kills the
// rest when the worker stops.
//
// The process must start no child processes other than through Runner once
// it is a subreaper: a sweep waits for the exited children that are not
// running programs (orphans that died by themselves), and their exit status
// would be lost to anyone else waiting. pgworker calls it in main.
//
// What is guaranteed, and where:
//   - always: when a run ends (exit, timeout, cancellation, worker stop),
//     every process left in its process group is killed;
//   - in a subreaper: so is every process it left in another session or
//     group that still carries its PGWORKER_RUN_ID, and its descendants;
//   - not guaranteed: a process that cleared its environment and left the
//     group (it is not attributed to a run), and anything left running when
//     the worker itself is killed with SIGKILL (the program gets SIGKILL
//     through its parent-death signal; its leftovers do not). A cgroup per
//     worker (systemd's KillMode=control-group) covers both.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER, 1): %w", err)
	}
	subreaper.Store(true)
	return nil
}

// KillOrphans kills and waits for every child of this process that a run
// left behind (it carries a PGWORKER_RUN_ID) and that is still alive: the
// worker calls it when it stops, after its last run. It returns how many
// processes it killed, and does nothing unless BecomeSubreaper was called.
func KillOrphans(log *slog.Logger) int {
	if !subreaper.Load() {
		return 0
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	needle := []byte(runIDVar + "=")
	return sweep(log, func(o orphan) bool { return hasEnvName(o.pid, needle) })
}

// orphan is a child of this process that is not a running program.
type orphan struct {
	pid    int
	pgid   int
	zombie bool
}

// sweepRun kills what the run with this pid (and process group) and token
// left: the members of its process group, and the processes that carry its
// PGWORKER_RUN_ID. Killing them can make their own children orphans in
// turn; sweep repeats until none is left.
func sweepRun(log *slog.Logger, pgid int, token string) int {
	needle := []byte(runIDVar + "=" + token + "\x00")
	return sweep(log, func(o orphan) bool {
		return o.pgid == pgid || hasEnv(o.pid, needle)
	})
}

// maxSweepRounds bounds the rounds of a sweep: a round kills the orphans it
// finds and waits for them, which hands their children to this process.
const maxSweepRounds = 100

// sweep kills the orphans that match (and waits for them), and waits for
// every orphan that has already exited, until a round finds nothing to do.
func sweep(log *slog.Logger, match func(orphan) bool) int {
	sweepMu.Lock()
	defer sweepMu.Unlock()
	killed := 0
	for round := 0; round < maxSweepRounds; round++ {
		var victims []int
		programsMu.Lock()
		for _, o := range orphans() {
			switch {
			case o.zombie:
				reap(o.pid, unix.WNOHANG)
			case match(o):
				if syscall.Kill(o.pid, syscall.SIGKILL) == nil {
					victims = append(victims, o.pid)
				}
			}
		}
		programsMu.Unlock()
		if len(victims) == 0 {
			return killed
		}
		for _, pid := range victims {
			if !reapWithin(pid, 10*time.Second) {
				log.Warn("a process the backend left behind does not die after SIGKILL (stuck in the kernel?)", "pid", pid)
			}
		}
		killed += len(victims)
	}
	log.Warn("the backend keeps starting processes while they are killed; giving up", "killed", killed)
	return killed
}

// orphans lists the children of this process that are not running
// programs. The caller holds programsMu.
func orphans() []orphan {
	self := os.Getpid()
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(self) + "/task/*/children")
	var out []orphan
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range bytes.Fields(b) {
			pid, err := strconv.Atoi(string(f))
			if err != nil || isProgram(pid) {
				continue
			}
			if o, ok := readStat(pid); ok {
				out = append(out, o)
			}
		}
	}
	return out
}

func isProgram(pid int) bool {
	pidsMu.Lock()
	defer pidsMu.Unlock()
	return programs[pid]
}

// readStat reads the state and process group of pid from /proc/PID/stat.
func readStat(pid int) (orphan, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return orphan{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may hold anything but ')' ends it last.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return orphan{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 {
		return orphan{}, false
	}
	pgid, _ := strconv.Atoi(string(f[2]))
	return orphan{pid: pid, pgid: pgid, zombie: f[0][0] == 'Z' || f[0][0] == 'X'}, true
}

// hasEnv reports whether the environment of pid holds needle
// ("NAME=value\x00").
func hasEnv(pid int, needle []byte) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	b = append(b, 0) // the last variable may lack its NUL
	return bytes.HasPrefix(b, needle) || bytes.Contains(b, append([]byte{0}, needle...))
}

// hasEnvName reports whether the environment of pid sets the variable
// prefix ("NAME=").
func hasEnvName(pid int, prefix []byte) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	return bytes.HasPrefix(b, prefix) || bytes.Contains(b, append([]byte{0}, prefix...))
}

// reap waits for the child pid; it never waits for any other.
func reap(pid, options int) bool {
	var ws unix.WaitStatus
	for {
		got, err := unix.Wait4(pid, &ws, options, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return got == pid || errors.Is(err, unix.ECHILD)
	}
}

// reapWithin waits for the child pid, which was sent SIGKILL, for at most
// limit.
func reapWithin(pid int, limit time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return reap(pid, unix.WNOHANG)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(limit)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return reap(pid, unix.WNOHANG)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if n > 0 || err != nil {
			return reap(pid, unix.WNOHANG)
		}
	}
}

// startProgram starts cmd and records its pid as a running program, so that
// no sweep mistakes it for an orphan, even when it exits at once.
func startProgram(cmd *exec.Cmd) error {
	programsMu.RLock()
	defer programsMu.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	pidsMu.Lock()
	programs[cmd.Process.Pid] = true
	pidsMu.Unlock()
	return nil
}

// programEnded forgets pid once its exit status has been collected.
func programEnded(pid int) {
	pidsMu.Lock()
	delete(programs, pid)
	pidsMu.Unlock()
}
