package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// shortFlags are the one-letter spellings of long flags: they share the
// long flag's variable.
var shortFlags = map[string]string{"o": "output"}

// envVar is the environment variable of the flag name: IDEM_ and the long
// name in capitals, dashes as underscores (--redis-url: IDEM_REDIS_URL).
func envVar(name string) string {
	if long, ok := shortFlags[name]; ok {
		name = long
	}
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// repeatable is a flag that may be given more than once: its variable
// holds the values separated by commas. Values from the variable are a
// default: the first value on the command line replaces them.
type repeatable interface {
	flag.Value
	// defaulted marks the values set so far as the default.
	defaulted()
}

// fromEnv gives every flag of fs its variable: the flag's default becomes
// the variable's value when the variable is set and not empty, and its
// help names the variable. Registering every flag before fromEnv runs is
// all a new flag needs to have its variable. The errors name the
// variables that do not parse.
func fromEnv(fs *flag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envVar(f.Name)
		f.Usage += " (" + name + ")"
		v := os.Getenv(name)
		if v == "" {
			return
		}
		values := []string{v}
		r, isRepeatable := f.Value.(repeatable)
		if isRepeatable {
			values = strings.Split(v, ",")
		}
		for _, v := range values {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				return
			}
		}
		if isRepeatable {
			r.defaulted()
		}
		// -h shows the value a variable gave, without its secrets.
		f.DefValue = redactValue(f.Name, f.Value.String())
	})
	return errors.Join(errs...)
}

// stringsFlag collects a repeated flag's values, in order.
type stringsFlag struct {
	values []string
	// isDefault is set while values come from the variable.
	isDefault bool
}

func (s *stringsFlag) String() string { return strings.Join(s.values, ",") }

func (s *stringsFlag) Set(v string) error {
	if s.isDefault {
		s.values, s.isDefault = nil, false
	}
	s.values = append(s.values, v)
	return nil
}

func (s *stringsFlag) defaulted() { s.isDefault = true }

// metadataFlag collects repeated name=value flags.
type metadataFlag struct {
	entries   map[string]string
	isDefault bool
}

func (m *metadataFlag) String() string {
	if m == nil {
		return ""
	}
	return metadataList(m.entries)
}

func (m *metadataFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=value, got %q", v)
	}
	if m.isDefault || m.entries == nil {
		m.entries, m.isDefault = map[string]string{}, false
	}
	m.entries[name] = value
	return nil
}

func (m *metadataFlag) defaulted() { m.isDefault = true }

// metadataList is entries as --set takes them, name=value, sorted by name
// and joined by commas.
func metadataList(entries map[string]string) string {
	parts := make([]string, 0, len(entries))
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		parts = append(parts, name+"="+entries[name])
	}
	return strings.Join(parts, ",")
}
