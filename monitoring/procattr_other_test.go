//go:build !linux

package monitoring_test

import "syscall"

// dieWithTest: only Linux can have a child killed with its parent.
func dieWithTest() *syscall.SysProcAttr { return nil }
