//go:build unix

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// runAsUser starts cmd in a process group of its own (a Ctrl-C in the
// terminal reaches the benchmark only, which then stops the servers) and,
// when u is set, as that user.
func runAsUser(cmd *exec.Cmd, u *osUser) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		attr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	cmd.SysProcAttr = attr
}

// fastShutdown sends SIGINT, PostgreSQL's fast shutdown: open
// transactions are rolled back and the server stops at once.
func fastShutdown(p *os.Process) error { return p.Signal(syscall.SIGINT) }

// processRunning reports whether pid is a running process: it exists and
// is not a zombie left for a parent that does not reap it (a postmaster
// started by pg_ctl is not the benchmark's child).
func processRunning(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // no /proc: trust kill(0)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}
