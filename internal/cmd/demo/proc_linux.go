package main

import "syscall"

// childAttr puts a worker in a process group of its own, so that a Ctrl-C in
// the terminal reaches the demo alone, which then stops the workers in
// order; and kills it should the demo die without cleaning up.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
