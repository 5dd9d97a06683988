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

// sample is one measured round of a scenario.
type sample struct {
	events  int64 // operations completed inside the measured window
	errors  int64
	seconds float64
	lat     []time.Duration
	allocs  int64    // heap allocations in the window; -1 when unknown
	cpu     cpuSplit // CPU time in the window, in milliseconds
	// total counts the operations completed in the whole round, warm-up
	// included: the database's counters (db) cover the whole round.
	total int64
	db    dbCost
	// walRels is the round's WAL by relation, for the last round at the
	// profiled concurrency.
	walRels []walShare
}

func (s sample) rate() float64 {
	if s.seconds == 0 {
		return 0
	}
	return float64(s.events) / s.seconds
}

// cell is one scenario at one concurrency: its rounds merged.
type cell struct {
	Scenario    string
	Concurrency int
	// Rate is the median of the rounds' events per second; Rates are the
	// rounds' own.
	Rate     float64
	Rates    []float64
	Events   int64
	Errors   int64
	P50, P99 time.Duration // over the events of all rounds
	// AllocsPerEvent is heap allocations per event in the process doing
	// the work; -1 when unknown.
	AllocsPerEvent float64
	CPU            cpuSplit // milliseconds per event
	// DB is the database's cost per event over all rounds (see dbCost).
	DB dbCost
	// WALByRelation is the last round's WAL by relation, when measured.
	WALByRelation []walShare
}

// median returns the median of xs (the mean of the middle two when their
// number is even), 0 for none.
func median(xs []float64) float64 {
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case n%2 == 0:
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
	return sorted[n/2]
}

// rate returns events per second.
func (c cell) rate() float64 { return c.Rate }

// merge combines the rounds of one scenario at concurrency c.
func merge(name string, c int, rounds []sample) cell {
	res := cell{Scenario: name, Concurrency: c, AllocsPerEvent: -1}
	var lat []time.Duration
	var allocs int64
	var cpu cpuSplit
	var db dbCost
	var total int64
	knownAllocs := len(rounds) > 0
	for _, s := range rounds {
		res.Rates = append(res.Rates, s.rate())
		res.Events += s.events
		res.Errors += s.errors
		lat = append(lat, s.lat...)
		if s.allocs < 0 {
			knownAllocs = false
		}
		allocs += s.allocs
		cpu.Client += s.cpu.Client
		cpu.Receiver += s.cpu.Receiver
		cpu.Rest += s.cpu.Rest
		db = db.add(s.db)
		total += s.total
		if s.walRels != nil {
			res.WALByRelation = s.walRels
		}
	}
	res.DB = db.per(total)
	res.Rate = median(res.Rates)
	res.P50, res.P99 = percentiles(lat)
	if res.Events > 0 {
		n := float64(res.Events)
		if knownAllocs {
			res.AllocsPerEvent = float64(allocs) / n
		}
		res.CPU = cpuSplit{Client: cpu.Client / n, Receiver: cpu.Receiver / n, Rest: cpu.Rest / n}
	}
	return res
}

// cpuSplit is CPU time in milliseconds, spent by the load generator (this
// process or pgbench), the HTTP receiver processes (when they run) and
// everything else on the machine (PostgreSQL, mostly).
type cpuSplit struct {
	Client, Receiver, Rest float64
}

// cpuSample is the CPU counters at one moment.
type cpuSample struct {
	self     time.Duration // this process
	receiver time.Duration // the receiver children, if any
	machine  time.Duration // all CPUs, busy time
}

func sampleCPU(receiverPIDs []int) cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range receiverPIDs {
		s.receiver += procCPU(pid)
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

// cpuBetween returns the CPU spent between two samples, in milliseconds.
// client is the load generator's CPU when it is not this process (pgbench).
func cpuBetween(a, b cpuSample, client time.Duration) cpuSplit {
	self := b.self - a.self
	if client > 0 {
		self = client
	}
	recv := b.receiver - a.receiver
	rest := b.machine - a.machine - self - recv
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return cpuSplit{Client: ms(self), Receiver: ms(recv), Rest: ms(max(rest, 0))}
}

// opFunc runs one event for worker w. It returns an error when the event
// was not applied.
type opFunc func(ctx context.Context, w int) error

// receiver identifies the processes that do the work of an HTTP row: one,
// or several behind a round-robin load generator.
type receiver struct {
	pids []int
	// mallocs reads the processes' count of heap allocations so far, summed.
	mallocs func() (uint64, error)
}

// measure runs op on c workers for warmup plus d and measures the
// operations that complete in the window [warmup, warmup+d]: their count
// over d is the throughput. Allocations are counted in this process, or in
// recv when it is not nil.
func measure(ctx context.Context, c int, warmup, d time.Duration, recv *receiver, op opFunc) sample {
	var receiverPIDs []int
	if recv != nil {
		receiverPIDs = recv.pids
	}
	start := time.Now()
	from, to := start.Add(warmup), start.Add(warmup+d)
	lat := make([][]time.Duration, c)
	errs := make([]int64, c)
	done := make([]int64, c) // successes in the whole round
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
		cpu0 = sampleCPU(receiverPIDs)
		time.Sleep(time.Until(to))
		m1 = mallocs()
		cpu1 = sampleCPU(receiverPIDs)
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
				if err == nil {
					done[w]++
				}
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
	res := sample{lat: slices.Concat(lat...), seconds: d.Seconds(), allocs: -1}
	res.events = int64(len(res.lat))
	for w := range c {
		res.errors += errs[w]
		res.total += done[w]
	}
	if mErr == nil && m1 >= m0 {
		res.allocs = int64(m1 - m0)
	}
	res.cpu = cpuBetween(cpu0, cpu1, 0)
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
