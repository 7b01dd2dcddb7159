//go:build !unix

package miniotest

import "os"

// Without SIGSTOP, Pause and Resume fail, and Stop kills.
var sigTerm, sigStop, sigCont os.Signal = os.Kill, nil, nil
