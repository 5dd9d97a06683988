package main

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cell is one measured scenario at one concurrency.
type cell struct {
	Scenario    string
	Concurrency int
	Events      int64 // operations completed inside the measured window
	Errors      int64
	Seconds     float64
	P50, P99    time.Duration
	// AllocsPerEvent is heap allocations per event in this process; -1 when
	// the work runs in another process.
	AllocsPerEvent float64
	CPU            cpuSplit
	Note           string
}

// rate returns events per second.
func (c cell) rate() float64 {
	if c.Seconds == 0 {
		return 0
	}
	return float64(c.Events) / c.Seconds
}

// cpuSplit is the CPU time spent per event, in milliseconds, by the load
// generator (this process or pgbench), the HTTP receiver (when one runs)
// and everything else on the machine (PostgreSQL, mostly).
type cpuSplit struct {
	Client, Receiver, Rest float64
}

// cpuSample is the CPU counters at one moment.
type cpuSample struct {
	self     time.Duration // this process
	receiver time.Duration // the receiver child, if any
	machine  time.Duration // all CPUs, busy time
}

func sampleCPU(receiverPID int) cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if receiverPID > 0 {
		s.receiver = procCPU(receiverPID)
	}
	s.machine = machineBusy()
	return s
}

// clockTick is USER_HZ, the unit of /proc CPU times on Linux.
const clockTick = 10 * time.Millisecond

// procCPU returns a process's user+system time from /proc/<pid>/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces; fields restart after its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * clockTick
}

// machineBusy returns the busy (non-idle, non-iowait) time of all CPUs.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 7 { // guest times are already counted in user
			break
		}
		busy += n
	}
	return time.Duration(busy) * clockTick
}

// split turns two samples around n events into CPU per event. client is
// the load generator's CPU when it is not this process (pgbench).
func split(a, b cpuSample, n int64, client time.Duration) cpuSplit {
	if n == 0 {
		return cpuSplit{}
	}
	self := b.self - a.self
	if client > 0 {
		self = client
	}
	recv := b.receiver - a.receiver
	rest := b.machine - a.machine - self - recv
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(n) }
	return cpuSplit{Client: ms(self), Receiver: ms(recv), Rest: ms(max(rest, 0))}
}

// opFunc runs one event for worker w. It returns an error when the event
// was not applied.
type opFunc func(ctx context.Context, w int) error

// receiver identifies the process that does the work of an HTTP row.
type receiver struct {
	pid int
	// mallocs reads the process's count of heap allocations so far.
	mallocs func() (uint64, error)
}

// measure runs op on c workers for warmup plus d and measures the
// operations that complete in the window [warmup, warmup+d]: their count
// over d is the throughput. Allocations are counted in this process, or in
// recv when it is not nil.
func measure(ctx context.Context, name string, c int, warmup, d time.Duration, recv *receiver, op opFunc) cell {
	receiverPID := 0
	if recv != nil {
		receiverPID = recv.pid
	}
	start := time.Now()
	from, to := start.Add(warmup), start.Add(warmup+d)
	lat := make([][]time.Duration, c)
	errs := make([]int64, c)
	var wg sync.WaitGroup
	// The counters are sampled at the window's edges by their own goroutine.
	var m0, m1 uint64
	var mErr error
	mallocs := func() uint64 {
		if recv != nil {
			n, err := recv.mallocs()
			mErr = errors.Join(mErr, err)
			return n
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.Mallocs
	}
	var cpu0, cpu1 cpuSample
	wg.Go(func() {
		time.Sleep(time.Until(from))
		m0 = mallocs()
		cpu0 = sampleCPU(receiverPID)
		time.Sleep(time.Until(to))
		m1 = mallocs()
		cpu1 = sampleCPU(receiverPID)
	})
	for w := range c {
		lat[w] = make([]time.Duration, 0, 1<<14)
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(to) {
					break
				}
				err := op(ctx, w)
				t1 := time.Now()
				if t1.Before(from) || t1.After(to) {
					continue
				}
				if err != nil {
					errs[w]++
					continue
				}
				lat[w] = append(lat[w], t1.Sub(t0))
			}
		})
	}
	wg.Wait()
	all := slices.Concat(lat...)
	res := cell{Scenario: name, Concurrency: c, Events: int64(len(all)), Seconds: d.Seconds(), AllocsPerEvent: -1}
	for _, e := range errs {
		res.Errors += e
	}
	res.P50, res.P99 = percentiles(all)
	if res.Events > 0 && mErr == nil && m1 >= m0 {
		res.AllocsPerEvent = float64(m1-m0) / float64(res.Events)
	}
	res.CPU = split(cpu0, cpu1, res.Events, 0)
	return res
}

// percentiles returns the 50th and 99th percentiles of lat (sorted in place).
func percentiles(lat []time.Duration) (time.Duration, time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	at := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return at(0.50), at(0.99)
}
