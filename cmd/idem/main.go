package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
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

// argsError is a usage error in the number of arguments: runCommand adds
// how to list the command's arguments to its message.
type argsError struct{ usage usageError }

func (e argsError) Error() string { return e.usage.Error() }
func (e argsError) Unwrap() error { return e.usage }

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
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		usage(stderr)
		return exitOK
	}
	var cmd *command
	if len(args) > 0 {
		for _, c := range commands {
			if c.name == args[0] {
				cmd = c
			}
		}
	}
	var err error
	switch {
	case len(args) == 0:
		err = usageError{fmt.Errorf("want a command: %s (idem -h says what each does)", commandNames())}
	case strings.HasPrefix(args[0], "-"):
		// Not quoted: it may be -flag=VALUE, and VALUE a secret.
		err = usageError{fmt.Errorf("the command comes first, then its flags: idem COMMAND [flags]; want %s (idem -h says what each does)", commandNames())}
	case cmd == nil:
		err = usageError{fmt.Errorf("unknown command %s%s: want %s (idem -h says what each does)", commandWord(args[0]), didYouMean(args[0], commandList()), commandNames())}
	default:
		err = runCommand(cmd, args[1:], stdin, stdout, stderr)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if !errors.Is(err, errReported) {
		fmt.Fprintln(stderr, "idem:", oneLine(err.Error()))
	}
	var ce codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

// errReported is a failure whose lines are on stderr already.
var errReported = errors.New("reported")

// commandWord quotes a word given as a command, unless it is not a word:
// a URL, say, which may hold a password.
func commandWord(w string) string {
	if len(w) > 30 || strings.ContainsFunc(w, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) {
		return "(not a command name)"
	}
	return strconv.Quote(w)
}

func commandList() []string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return names
}

// commandNames is "inspect, release, ... or version".
func commandNames() string {
	names := commandList()
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
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
	if err := parseFlags(fs, cmd, args, stderr); err != nil {
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
	err = g.describe(ctx, cmd.run(ctx, e, opts, fs.Args()))
	var count argsError
	if errors.As(err, &count) {
		return usageError{fmt.Errorf("%w: run idem %s -h for its arguments and flags", count, cmd.name)}
	}
	return err
}

// parseFlags parses args into fs. -h prints cmd's usage; a flag that is
// not cmd's, or a bad value, is one line that names it and says how to
// list the flags, rather than the flag package's usage text.
func parseFlags(fs *flag.FlagSet, cmd *command, args []string, stderr io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(interleaved(fs, args))
	fs.SetOutput(stderr)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return err
	}
	if err == nil {
		return nil
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = fmt.Sprintf("idem %s has no flag %s%s", cmd.name, flagSpelling(name), flagHint(fs, cmd, name))
	} else if arg, ok := strings.CutPrefix(msg, "bad flag syntax: "); ok {
		// The argument may be -x=VALUE: only its name is shown.
		name, _, _ := strings.Cut(arg, "=")
		msg = "bad flag syntax: " + name
	} else {
		// "invalid value "x" for flag -limit", "flag needs an argument:
		// -o": the flag as the docs spell it.
		msg = flagName.ReplaceAllStringFunc(msg, func(m string) string {
			i := strings.LastIndexByte(m, '-')
			return m[:i] + flagSpelling(m[i+1:])
		})
	}
	return usageError{fmt.Errorf("%s: run idem %s -h for its flags", msg, cmd.name)}
}

// flagName is a flag as the flag package names it in its errors.
var flagName = regexp.MustCompile(`(for flag|argument:) -[a-z][a-z0-9-]*`)

// flagHint suggests the flag that was meant: -o json for --json, the
// flag of cmd whose name is closest, or the command that has the flag.
func flagHint(fs *flag.FlagSet, cmd *command, name string) string {
	if name = strings.TrimLeft(name, "-"); name == "json" || name == "table" {
		return " (-o " + name + ")"
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, flagSpelling(f.Name)) })
	if hint := didYouMean(flagSpelling(name), names); hint != "" {
		return hint
	}
	var others []string
	for _, c := range commands {
		if c == cmd || c.flags == nil {
			continue
		}
		other := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(other)
		if other.Lookup(name) != nil {
			others = append(others, "idem "+c.name)
		}
	}
	switch len(others) {
	case 0:
		return ""
	case 1:
		return " (" + others[0] + " takes it)"
	default:
		return " (" + strings.Join(others, " and ") + " take it)"
	}
}

// flagSpelling is how the docs spell a flag: -o, --namespace.
func flagSpelling(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// didYouMean returns " (did you mean X?)" for the candidate closest to
// word, if one is close enough to be a typo of it.
func didYouMean(word string, candidates []string) string {
	if c := closest(word, candidates); c != "" {
		return fmt.Sprintf(" (did you mean %s?)", c)
	}
	return ""
}

// closest returns the candidate closest to word, if one is close enough
// to be a typo of it: at most two edits, and a third of its length.
func closest(word string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if d := editDistance(word, c); d < bestDist && d <= max(1, len(c)/3) {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
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
		fmt.Fprintf(fs.Output(), "usage: idem %s [flags] %s\n\n%s\n\nflags:\n", cmd.name, cmd.args, cmd.help)
		fs.PrintDefaults()
	}
	if err := fromEnv(fs); err != nil {
		return nil, nil, nil, usageError{err}
	}
	return fs, g, opts, nil
}

// interleaved moves flags that follow positional arguments before them,
// so that "idem inspect KEY -o json" works as "idem inspect -o json KEY".
// Everything after "--" stays positional. A flag that wants a value and
// ends args is left last, for the flag package to say it lacks one.
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
			if f := fs.Lookup(name); f != nil && !isBool(f) {
				if i+1 == len(args) {
					// Its value is missing: the flag package says so,
					// rather than take "--" or an argument for it.
					return flags
				}
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
		got := fmt.Sprintf("%d arguments", len(args))
		if len(args) == 1 {
			got = "1 argument"
		}
		return argsError{usageError{fmt.Errorf("want %s, got %s", what, got)}}
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
