package main

import "syscall"

// setDeathSignal has the kernel kill a server whose testenv died.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
