package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// startDashboard runs pgworker dashboard on a free loopback port, with the
// outputs downloadable, and returns its URL.
func (d *demo) startDashboard(ctx context.Context) error {
	logPath := filepath.Join(d.cfg.Out, "logs", "dashboard.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.cfg.Pgworker, "dashboard", "--addr", "127.0.0.1:0",
		"--output-store", "file://"+filepath.Join(d.cfg.Out, "results"), "--log-format", "json")
	cmd.Env = d.env
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start pgworker dashboard: %w", err)
	}
	d.rep.PIDs = append(d.rep.PIDs, cmd.Process.Pid)
	exited := make(chan struct{})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	d.onCleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	select {
	case line := <-lines:
		url, ok := strings.CutPrefix(line, "pgworker dashboard on ")
		if !ok {
			return fmt.Errorf("pgworker dashboard said %q; its log: %s", line, logPath)
		}
		d.dashboard = url
	case <-exited:
		return fmt.Errorf("pgworker dashboard exited at start; its log: %s", logPath)
	case <-ctx.Done():
		return ctx.Err()
	}
	d.step("pgworker dashboard on %s: open it to watch the rows move", d.dashboard)
	return nil
}
