//go:build unix

package miniotest

import (
	"os"
	"syscall"
)

var sigTerm, sigStop, sigCont os.Signal = syscall.SIGTERM, syscall.SIGSTOP, syscall.SIGCONT
