// Command lastseen runs the lastseen demo, operator commands and the
// benchmark. From a checkout of the repository (this directory is a module
// of its own):
//
//	go -C cmd/lastseen run . demo                  # no services needed
//	go -C cmd/lastseen run . status --postgres DSN --redis ADDR
//	go -C cmd/lastseen run . flush  --postgres DSN --redis ADDR
//	go -C cmd/lastseen run . purge  --postgres DSN --redis ADDR [--dry-run] [--rule NAME]
//	go -C cmd/lastseen run . purge  --postgres DSN [--idle-timeout D] # an app without Redis
//	go -C cmd/lastseen run . buffers --redis ADDR
//	go -C cmd/lastseen run . drop   --redis ADDR --prefix P [--force]
//	go -C cmd/lastseen run . bench  --postgres DSN --redis ADDR
//	go -C cmd/lastseen run . bench memory          # starts its own redis-server
//
// Exit status: 0 success, 1 the command failed (its error on stderr), 2 the
// command line is wrong (one line naming the problem and a hint on stderr;
// nothing was opened).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/alecthomas/kong"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/bench"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/redis/go-redis/v9"
)

// Exit codes, as the README states them.
const (
	exitOK     = 0 // the command did what it was asked
	exitFailed = 1 // the command ran and failed: a connection, a check, a held lock, refused entries
	exitUsage  = 2 // the command line is wrong; nothing was opened
)

// cli is the command line: one command each, with its flags.
type cli struct {
	Demo    demoCmd    `cmd:"" help:"Run a realistic workload through the HTTP middleware and print a summary (SQLite and in-process Redis unless --postgres/--redis are given)."`
	Status  statusCmd  `cmd:"" help:"Print pending users per shard, the oldest pending age, the users table's health (indexes on the last-seen column, HOT share, fillfactor), the expired sessions and the rows each inactivity rule finds inactive."`
	Flush   flushCmd   `cmd:"" help:"Flush pending timestamps of a Redis buffer into the database now. An app without Redis keeps its buffer in its own memory, which only the app flushes (its schedule, Plugin.Flush, Close). The app's Config.OnBatch hook does not run here: derived columns are not updated."`
	Purge   purgeCmd   `cmd:"" help:"Delete expired sessions now, by the app's rule, and run the app's inactivity rules that delete (--dry-run: count what they would act on; a rule with the app's Action is only counted)."`
	Buffers buffersCmd `cmd:"" help:"List the buffers in a Redis: prefix, tracked table and column, model, shards, pending and in-flight counts."`
	Drop    dropCmd    `cmd:"" help:"Delete an abandoned buffer (refused while it holds timestamps, unless --force)."`
	Bench   bench.Cmd  `cmd:"" help:"Benchmark lastseen against writing last_seen_at on every request."`
}

func main() {
	os.Exit(run(&cli{}, os.Args[1:], os.Stdout, os.Stderr))
}

// quietRedis drops go-redis's own log lines (a failed dial, a pool
// message): the command reports the error itself, on one line.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// exitRequest carries kong's exit (after --help) out of the parser.
type exitRequest struct{ code int }

// run parses args into c, runs the chosen command and returns the exit
// code. Output goes to stdout, errors and warnings to stderr, unless a
// test set a command's writers already.
func run(c *cli, args []string, stdout, stderr io.Writer) (code int) {
	c.setWriters(stdout, stderr)
	redis.SetLogger(quietRedis{}) // errors reach the user as the command's one line
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(exitRequest)
			if !ok {
				panic(r)
			}
			code = e.code
		}
	}()
	parser, err := newParser(c, kong.Writers(stdout, stderr), kong.Exit(func(code int) { panic(exitRequest{code}) }))
	if err != nil {
		fmt.Fprintf(stderr, "lastseen: %v\n", err)
		return exitFailed
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		var perr *kong.ParseError
		command := ""
		if errors.As(err, &perr) && perr.Context != nil {
			command = perr.Context.Command()
		}
		usage(stderr, err, command)
		return exitUsage
	}
	if err := kctx.Run(); err != nil {
		var uerr *runenv.UsageError
		if errors.As(err, &uerr) {
			usage(stderr, err, kctx.Command())
			return exitUsage
		}
		fmt.Fprintln(stderr, prefixed(err))
		return exitFailed
	}
	return exitOK
}

// newParser builds the command line with the defaults taken from the
// library (flagVars).
func newParser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{
		kong.Name("lastseen"),
		kong.Description("Last-seen tracking and session housekeeping for GORM apps."),
		flagVars(),
	}, opts...)...)
}

// usage writes the one-line problem and a hint naming the help to read.
func usage(w io.Writer, err error, command string) {
	fmt.Fprintln(w, prefixed(err))
	name, _, _ := strings.Cut(command, " ")
	if name == "" {
		fmt.Fprintln(w, `run "lastseen --help" for the commands`)
		return
	}
	fmt.Fprintf(w, "run \"lastseen %s --help\" for its flags\n", name)
}

// prefixed returns the error's message starting with "lastseen:" (the
// commands' own errors do already; kong's do not).
func prefixed(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "lastseen:") {
		msg = "lastseen: " + msg
	}
	return msg
}

// setWriters points every command's output at stdout and its warnings at
// stderr, keeping writers a test set.
func (c *cli) setWriters(stdout, stderr io.Writer) {
	for _, w := range []struct{ out, err *io.Writer }{
		{&c.Demo.out, &c.Demo.errOut}, {&c.Status.out, &c.Status.errOut},
		{&c.Flush.out, &c.Flush.errOut}, {&c.Purge.out, &c.Purge.errOut},
		{&c.Buffers.out, &c.Buffers.errOut}, {&c.Drop.out, &c.Drop.errOut},
	} {
		if *w.out == nil {
			*w.out = stdout
		}
		if *w.err == nil {
			*w.err = stderr
		}
	}
	c.Bench.SetWriters(stdout, stderr)
}
