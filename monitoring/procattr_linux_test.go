package monitoring_test

import "syscall"

// dieWithTest has the kernel kill the child if the test process dies.
func dieWithTest() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
