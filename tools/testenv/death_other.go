//go:build !linux

package main

import "syscall"

// setDeathSignal does nothing where the kernel cannot tie a server's life
// to testenv's: a killed testenv leaves its servers running.
func setDeathSignal(*syscall.SysProcAttr) {}
