package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Exit codes. A mistake in the command line (usageError) exits with
// exitError, as does a store that does not answer or answers with an error.
const (
	exitOK       = 0
	exitError    = 1
	exitNotFound = 2
	exitRefused  = 3
)

// codedError is an outcome about a key that has its own exit code and,
// for the commands that act on one key, its own action in the JSON output.
type codedError struct {
	code   int
	action string
	// key, if set, is quoted in front of the message, which then says
	// something about it: "has no record".
	key string
	err error
}

func (e codedError) Error() string {
	if e.key == "" {
		return e.err.Error()
	}
	return strconv.Quote(e.key) + " " + e.err.Error()
}

func (e codedError) Unwrap() error { return e.err }

// notFound is exit code 2, action not_found.
func notFound(key, format string, args ...any) error {
	return codedError{exitNotFound, actionNotFound, key, fmt.Errorf(format, args...)}
}

// refused is exit code 3, with the action that says why.
func refused(action, key, format string, args ...any) error {
	return codedError{exitRefused, action, key, fmt.Errorf(format, args...)}
}

// usageError is a mistake in the command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// command is one subcommand.
type command struct {
	name, args, help string
	// flags registers the command's own flags.
	flags func(fs *flag.FlagSet) any
	// store is false for commands that need no store, or open it
	// themselves.
	store bool
	// storeName is the store a store's own command (pg, mysql, dynamodb)
	// works on, whatever --store says.
	storeName string
	// timeout replaces the default of --timeout, unless IDEM_TIMEOUT is
	// set, for a command that takes longer than the others.
	timeout time.Duration
	run     func(ctx context.Context, e *env, opts any, args []string) error
}

// env is what a running command has.
type env struct {
	g      *globals
	store  operatorStore
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

var commands = []*command{inspectCmd, releaseCmd, completeCmd, deleteCmd, listCmd, statsCmd, keyCmd, pgCmd, mysqlCmd, dynamoCmd, versionCmd}

func main() {
	quietLibraries()
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitError
		}
		return exitOK
	}
	var cmd *command
	for _, c := range commands {
		if c.name == args[0] {
			cmd = c
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "idem: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitError
	}
	err := runCommand(cmd, args[1:], stdin, stdout, stderr)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintln(stderr, "idem:", oneLine(err.Error()))
	var ce codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

// runCommand runs cmd with its arguments. The error it returns, printed as
// idem's one line, holds no secret of the flags or the environment.
func runCommand(cmd *command, args []string, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	var g *globals
	defer func() {
		if err != nil {
			err = scrubbedError{err, g.secrets()}
		}
	}()
	fs, g, opts, err := newFlagSet(cmd, stderr)
	if err != nil {
		return err
	}
	if err := fs.Parse(interleaved(fs, args)); err != nil {
		return err
	}
	if cmd.storeName != "" {
		g.store = cmd.storeName
	}
	if err := g.validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	e := &env{g: g, stdin: stdin, stdout: stdout, stderr: stderr}
	if cmd.store {
		s, closeFn, err := storeOpener(ctx, g, true)
		if err != nil {
			return err
		}
		defer closeFn()
		e.store = s
	}
	// Every store call of the command ran under ctx: its failure is
	// described here, once, by what the server did.
	return g.describe(ctx, cmd.run(ctx, e, opts, fs.Args()))
}

// newFlagSet returns cmd's flag set: the global flags and the command's
// own, each defaulting to its IDEM_* variable (see fromEnv), and the
// values they fill in. A variable that does not parse is a usage error.
func newFlagSet(cmd *command, stderr io.Writer) (*flag.FlagSet, *globals, any, error) {
	fs := flag.NewFlagSet("idem "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	g := &globals{}
	g.register(fs)
	if cmd.timeout > 0 {
		f := fs.Lookup("timeout")
		_ = f.Value.Set(cmd.timeout.String())
		f.DefValue = cmd.timeout.String()
	}
	var opts any
	if cmd.flags != nil {
		opts = cmd.flags(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: idem %s [flags] %s\n\n%s\n\nflags:\n", cmd.name, cmd.args, cmd.help)
		fs.PrintDefaults()
	}
	if err := fromEnv(fs); err != nil {
		return nil, nil, nil, usageError{err}
	}
	return fs, g, opts, nil
}

// interleaved moves flags that follow positional arguments before them,
// so that "idem inspect KEY -o json" works as "idem inspect -o json KEY".
// Everything after "--" stays positional.
func interleaved(fs *flag.FlagSet, args []string) []string {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			positional = append(positional, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBool(f) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
		default:
			positional = append(positional, a)
		}
	}
	return append(append(flags, "--"), positional...)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: idem COMMAND [flags] [ARGS]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.help)
	}
	fmt.Fprintln(w, "\nRun idem COMMAND -h for its flags; each flag defaults to its IDEM_* variable (--redis-url: IDEM_REDIS_URL).")
	fmt.Fprintln(w, "Exit codes: 0 done, 1 error (a usage error, or a store that does not answer or answers with an error), 2 not found, 3 refused.")
}

// exactArgs checks the number of positional arguments.
func exactArgs(args []string, n int, what string) error {
	if len(args) != n {
		return usageError{fmt.Errorf("want %s, got %d arguments", what, len(args))}
	}
	return nil
}

// oneLine joins the lines of a message, so that every failure is one line
// on stderr: pgx, for one, reports each address it tried on a line of its
// own, after a line that ends with a colon.
func oneLine(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		switch {
		case b.Len() == 0:
		case strings.HasSuffix(b.String(), ":"):
			b.WriteString(" ")
		default:
			b.WriteString("; ")
		}
		b.WriteString(l)
	}
	return b.String()
}
