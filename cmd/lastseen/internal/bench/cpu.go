package bench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// cpuUse is the CPU time one write of the flush benchmark cost, in
// seconds, by part: the benchmark's own process (for the library's flush:
// its client side, GORM and the drivers, with the benchmark's hooks), the
// Redis server (INFO cpu, used_cpu_user + used_cpu_sys: every client of
// that server counts), and the database backends serving the write's
// connections (utime + stime of /proc/<pid>/stat, in clock ticks of 1/100
// s, Linux's USER_HZ). A part that cannot be read here (no /proc, a
// database on another machine, a Redis that refuses INFO) is -1.
type cpuUse struct {
	Client   float64 `json:"client_cpu_s"`
	Redis    float64 `json:"redis_cpu_s"`
	Database float64 `json:"database_cpu_s"`
}

// perThousand is s seconds per 1,000 of rows, in milliseconds; -1 when s
// is unknown (-1) or rows is 0.
func perThousand(s float64, rows int64) float64 {
	if s < 0 || rows <= 0 {
		return -1
	}
	return s * 1000 / float64(rows) * 1000
}

// cpuMeter reads the three parts before and after a write; a write
// without Redis counts 0 for it.
type cpuMeter struct {
	redis    *redis.Client // nil: the write uses no Redis
	backends []int         // the database backends' process ids
	before   cpuUse
}

// start reads the parts once; stop reads them again and returns the
// difference.
func (m *cpuMeter) start(ctx context.Context) { m.before = m.read(ctx) }

func (m *cpuMeter) stop(ctx context.Context) cpuUse {
	after := m.read(ctx)
	diff := func(a, b float64) float64 {
		if a < 0 || b < 0 {
			return -1
		}
		return a - b
	}
	return cpuUse{Client: diff(after.Client, m.before.Client), Redis: diff(after.Redis, m.before.Redis),
		Database: diff(after.Database, m.before.Database)}
}

func (m *cpuMeter) read(ctx context.Context) cpuUse {
	u := cpuUse{Client: procCPU("self")}
	if m.redis != nil {
		u.Redis = redisCPU(ctx, m.redis)
	}
	if len(m.backends) == 0 {
		u.Database = -1
	}
	for _, pid := range m.backends {
		s := procCPU(strconv.Itoa(pid))
		if s < 0 {
			u.Database = -1
			break
		}
		u.Database += s
	}
	return u
}

// procCPU is process pid's user and system CPU time in seconds from
// /proc/<pid>/stat (fields 14 and 15, after the command in parentheses), or
// -1 when it cannot be read.
func procCPU(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	return parseProcStat(string(b))
}

// parseProcStat reads utime + stime, in seconds at 100 ticks a second, from
// the text of /proc/<pid>/stat; -1 when the text is not one.
func parseProcStat(s string) float64 {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:]) // from field 3, the state
	if len(f) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return float64(utime+stime) / 100
}

// redisCPU is the Redis server's used_cpu_user + used_cpu_sys in seconds
// (INFO cpu), or -1.
func redisCPU(ctx context.Context, rdb *redis.Client) float64 {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return -1
	}
	return parseRedisCPU(info)
}

// parseRedisCPU sums used_cpu_user and used_cpu_sys of an INFO cpu reply;
// -1 when either is missing.
func parseRedisCPU(info string) float64 {
	var sum float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user" && k != "used_cpu_sys") {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return -1
		}
		sum += x
		found++
	}
	if found != 2 {
		return -1
	}
	return sum
}

// poolBackends returns the process ids of the database backends behind
// pool's n connections (pg_backend_pid), each connection held while the
// others are taken so that every one is asked.
func poolBackends(ctx context.Context, pool *sql.DB, n int) ([]int, error) {
	var pids []int
	err := withEachConn(ctx, pool, n, func(c *sql.Conn) error {
		var pid int
		err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid)
		pids = append(pids, pid)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: backend pid: %w", err)
	}
	return pids, nil
}
