package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitNotFound = 2
	exitRefused  = 3
)

// codedError carries a command's exit code.
type codedError struct {
	code int
	err  error
}

func (e codedError) Error() string { return e.err.Error() }
func (e codedError) Unwrap() error { return e.err }

func notFound(format string, args ...any) error {
	return codedError{exitNotFound, fmt.Errorf(format, args...)}
}

func refused(format string, args ...any) error {
	return codedError{exitRefused, fmt.Errorf(format, args...)}
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

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

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
	fmt.Fprintln(stderr, "idem:", err)
	var ce codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

func runCommand(cmd *command, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idem "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	g := &globals{}
	g.register(fs)
	if cmd.timeout > 0 && os.Getenv("IDEM_TIMEOUT") == "" {
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
		s, closeFn, err := openStore(ctx, g, true)
		if err != nil {
			return err
		}
		defer closeFn()
		e.store = s
	}
	return cmd.run(ctx, e, opts, fs.Args())
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
	fmt.Fprintln(w, "\nRun idem COMMAND -h for its flags. Exit codes: 0 done, 1 error, 2 not found, 3 refused.")
}

// exactArgs checks the number of positional arguments.
func exactArgs(args []string, n int, what string) error {
	if len(args) != n {
		return usageError{fmt.Errorf("want %s, got %d arguments", what, len(args))}
	}
	return nil
}
