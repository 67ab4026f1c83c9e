//go:build !unix

package tests

import "testing"

// cpuClock reports nothing where getrusage(2) is missing.
type cpuClock struct{}

func startCPUClock() cpuClock { return cpuClock{} }

func (cpuClock) report(*testing.B) {}
