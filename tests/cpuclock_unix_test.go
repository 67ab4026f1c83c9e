//go:build unix

package tests

import (
	"syscall"
	"testing"
	"time"
)

// cpuClock reads the process's CPU time (user and system, every thread),
// getrusage(2) RUSAGE_SELF.
type cpuClock struct{ start time.Duration }

func startCPUClock() cpuClock { return cpuClock{start: processCPU()} }

// report adds cpu-ns/op, the process's CPU time since start per b.N.
func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
