//go:build unix

package main

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used so far, user and
// system, every thread; ok is false when the system does not tell.
func processCPU() (_ time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
