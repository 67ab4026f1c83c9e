//go:build unix

package tests

import (
	"syscall"
	"time"
)

// processCPU is the process's CPU time so far (user and system, every
// thread): getrusage(2) RUSAGE_SELF.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
