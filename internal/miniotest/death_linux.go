package miniotest

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills the server when the test process dies, also when
// it dies without running its cleanups.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
