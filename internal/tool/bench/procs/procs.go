// Package procs runs the parties of a benchmark as separate processes —
// the gateway binary, the reference engine, a bare Go reverse proxy — and
// reads what each costs in CPU from /proc, so that the load generator's
// own work is never counted against the process measured.
package procs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ClockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports.
const ClockTicks = 100

var (
	// ErrNotReady: a process did not become ready in time, or exited.
	ErrNotReady = errors.New("procs: not ready")
	// ErrNoProc: /proc is not there (not Linux).
	ErrNoProc = errors.New("procs: /proc is not available")
)

// Build compiles the main package pkg (a path relative to the module root,
// like "./cmd/gateway") into dir, with flags given to go build before the
// package, and returns the binary's path.
func Build(ctx context.Context, dir, pkg string, flags ...string) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	args := append([]string{"build", "-o", out}, flags...)
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("procs: go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

func moduleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("procs: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("procs: not inside a Go module")
	}
	return filepath.Dir(mod), nil
}

// FreeAddrs returns n distinct loopback addresses whose ports the OS just
// handed out. Every listener is held until all are picked, so no port is
// handed out twice.
func FreeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("procs: free port: %w", err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// Proc is a running child process whose output goes to a log file.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// Start starts bin with args and extra environment; its stdout and stderr
// go to a file in dir.
func Start(name, dir, bin string, args, env []string) (*Proc, error) {
	log := filepath.Join(dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return nil, fmt.Errorf("procs: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so Stop ends whatever it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("procs: start %s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Log returns the last lines the process wrote.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimSpace(string(b))
}

// Stop ends the process and its process group (SIGTERM, SIGKILL after
// grace) and waits for it.
func (p *Proc) Stop(grace time.Duration) {
	pgid := -p.Pid()
	select {
	case <-p.done:
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		return
	default:
	}
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

// WaitHTTP polls url until it answers want, the process exits or within
// passes.
func (p *Proc) WaitHTTP(ctx context.Context, url string, want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%w: %s exited (%v): %s", ErrNotReady, p.Name, p.err, p.Log())
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %w", ErrNotReady, p.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s did not answer %d on %s within %v: %s", ErrNotReady, p.Name, want, url, within, p.Log())
		}
	}
}

// CPU returns the user plus system CPU time process pid has used, and with
// children also that of its live child processes (nginx's workers).
func CPU(pid int, children bool) (time.Duration, error) {
	ticks, _, err := stat(pid)
	if err != nil {
		return 0, err
	}
	if children {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrNoProc, err)
		}
		for _, e := range ents {
			child, err := strconv.Atoi(e.Name())
			if err != nil || child == pid {
				continue
			}
			t, ppid, err := stat(child)
			if err == nil && ppid == pid {
				ticks += t
			}
		}
	}
	return time.Duration(ticks) * time.Second / ClockTicks, nil
}

// SelfCPU is this process's user plus system CPU time so far, to the
// microsecond (getrusage; /proc counts in clock ticks of 10 ms).
func SelfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("procs: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// stat reads utime+stime (in clock ticks) and the parent pid of pid.
func stat(pid int) (ticks int64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, serr := os.Stat("/proc/self/stat"); serr != nil {
				return 0, 0, fmt.Errorf("%w: %w", ErrNoProc, serr)
			}
		}
		return 0, 0, fmt.Errorf("procs: %w", err)
	}
	return ParseStat(b)
}

// ParseStat reads utime+stime and ppid from the text of /proc/PID/stat.
// The command name (field 2) may hold spaces and parentheses, so fields
// are counted from the last ')'.
func ParseStat(b []byte) (ticks int64, ppid int, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("procs: malformed /proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("procs: malformed /proc stat: %d fields", len(f)+2)
	}
	pp, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, 0, fmt.Errorf("procs: malformed /proc stat: %w", err)
	}
	return ut + st, pp, nil
}

// Counter reads one counter or gauge from a Prometheus text exposition
// (the first sample of the named series without labels), e.g. the
// gateway's go_memstats_alloc_bytes_total.
func Counter(exposition []byte, name string) (float64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		return v, err == nil
	}
	return 0, false
}

// Switches returns the context switches, voluntary and not, that the
// threads of process pid have made so far: each time one went to sleep
// or was preempted. Threads that have exited are not counted.
func Switches(pid int) (int64, error) {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, fmt.Errorf("procs: %w", err)
	}
	var sum int64
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, d.Name()))
		if err != nil {
			continue // the thread exited meanwhile
		}
		n, err := ParseSwitches(b)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// ParseSwitches sums voluntary_ctxt_switches and nonvoluntary_ctxt_switches
// in the text of /proc/PID/task/TID/status.
func ParseSwitches(b []byte) (int64, error) {
	var sum int64
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || name != "voluntary_ctxt_switches" && name != "nonvoluntary_ctxt_switches" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("procs: malformed /proc status: %s: %w", name, err)
		}
		sum += n
		found++
	}
	if found != 2 {
		return 0, errors.New("procs: malformed /proc status: no context switch counts")
	}
	return sum, nil
}
