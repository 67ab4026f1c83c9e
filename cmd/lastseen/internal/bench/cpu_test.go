package bench

import (
	"testing"

	"github.com/lastseen/lastseen/tests/testenv"
)

func TestParseProcStat(t *testing.T) {
	// A command with a space and a parenthesis: fields count from the last ')'.
	line := "4242 (post gres) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 1 0 100 1000 50 18446744073709551615"
	testenv.Equal(t, "utime 250 + stime 75 ticks", parseProcStat(line), 3.25)
	testenv.Equal(t, "no parenthesis", parseProcStat("4242 postgres S 1"), -1.0)
	testenv.Equal(t, "too short", parseProcStat("4242 (postgres) S 1 2"), -1.0)
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.000000\r\n"
	testenv.Equal(t, "sys + user, children left out", parseRedisCPU(info), 3.75)
	testenv.Equal(t, "user missing", parseRedisCPU("used_cpu_sys:1.5\r\n"), -1.0)
}

func TestPerThousand(t *testing.T) {
	testenv.Equal(t, "1.5 s for 200,000 rows", perThousand(1.5, 200000), 7.5)
	testenv.Equal(t, "unknown", perThousand(-1, 200000), -1.0)
	testenv.Equal(t, "no rows", perThousand(1, 0), -1.0)
}
