package main

import (
	"cmp"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
)

// What idem must never print: the passwords that store flags carry, and
// the AWS secret keys of its environment.
//
// Two defences. A message that shows a flag's value shows it redacted
// (redactValue), whether or not the value parses: the values that fail
// to parse are the ones a message shows. And the one line idem prints
// for a failure is scrubbed of every secret the flags and variables hold
// (scrub): client libraries word their own errors, and some quote what
// they were given (a url.Error quotes the whole URL).

// secretFlags are the flags whose value may hold a secret, each with the
// function that finds the secrets' positions in a value.
var secretFlags = map[string]func(string) [][2]int{
	"redis-url":       urlSecrets,
	"redis-cluster":   urlSecrets,
	"pg-url":          urlSecrets,
	"mysql-dsn":       dsnSecrets,
	"dynamo-endpoint": urlSecrets,
}

// secretVariables are the variables, besides those of secretFlags, whose
// value is a secret: the AWS SDK reads them.
var secretVariables = []string{"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}

// mask replaces a secret.
const mask = "xxxxx"

// keyValueSecret is a name=value pair whose name says the value is a
// secret (password, passwd, sslpassword, passphrase, secret, token,
// pwd), in a URL's query or a keyword/value connection string; the
// value may be quoted, and the quote left open.
var keyValueSecret = regexp.MustCompile(`(?i)(?:^|[?&;\s])[a-z0-9_.-]*(?:pass|pwd|secret|token)[a-z0-9_.-]*\s*=\s*('(?:[^'\\]|\\.)*'?|[^&;\s]*)`)

// urlSecrets finds the password of a URL, and the values of its query
// parameters that name a secret. The password is what lies between the
// first ':' of the user info (after "scheme://", if there is one) and
// the last '@': a URL that does not parse (a space in the port, a
// missing scheme) has its password found all the same. It may find more
// than the password (an '@' later in the URL), never less.
func urlSecrets(s string) [][2]int {
	var out [][2]int
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + len("://")
	}
	if at := strings.LastIndexByte(s, '@'); at > start {
		if colon := strings.IndexByte(s[start:at], ':'); colon >= 0 {
			out = append(out, [2]int{start + colon + 1, at})
		}
	}
	for _, m := range keyValueSecret.FindAllStringSubmatchIndex(s, -1) {
		out = append(out, [2]int{m[2], m[3]})
	}
	return out
}

// dsnSecrets finds the password of a go-sql-driver DSN,
// [user[:password]@][net[(addr)]]/db[?params], as urlSecrets does. A DSN
// with no '@' has no password; but "user:password/db", the '@' and
// address left out, would be read as a network named "user:password",
// which the driver's errors quote: a ':' before the first '(' and '/'
// starts a password too.
func dsnSecrets(s string) [][2]int {
	out := urlSecrets(s)
	if strings.IndexByte(s, '@') < 0 {
		end := len(s)
		if i := strings.IndexAny(s, "(/"); i >= 0 {
			end = i
		}
		if colon := strings.IndexByte(s[:end], ':'); colon >= 0 {
			out = append(out, [2]int{colon + 1, end})
		}
	}
	return out
}

// redactValue returns the value of a secret flag with every secret in it
// replaced by xxxxx; a flag that holds none is returned as it is.
func redactValue(flagName, value string) string {
	find, ok := secretFlags[flagName]
	if !ok {
		return value
	}
	spans := find(value)
	slices.SortFunc(spans, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
	var b strings.Builder
	pos := 0
	for _, sp := range spans {
		if sp[1] <= sp[0] || sp[1] <= pos {
			continue
		}
		b.WriteString(value[pos:max(pos, sp[0])])
		b.WriteString(mask)
		pos = sp[1]
	}
	b.WriteString(value[pos:])
	return b.String()
}

// secretsIn returns the secrets of a secret flag's value, each as it is
// written and as a library may print it decoded (percent-decoded, its
// quotes removed).
func secretsIn(flagName, value string) []string {
	find, ok := secretFlags[flagName]
	if !ok {
		return nil
	}
	var out []string
	for _, sp := range find(value) {
		s := value[sp[0]:sp[1]]
		if s == "" {
			continue
		}
		out = append(out, s)
		if q := strings.Trim(s, "'"); q != s && q != "" {
			out = append(out, q, strings.ReplaceAll(q, `\'`, `'`))
		}
		if d, err := url.PathUnescape(s); err == nil && d != s && d != "" {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(s); err == nil && d != s && d != "" {
			out = append(out, d)
		}
	}
	return out
}

// secrets returns every secret idem may have been given: those in the
// values of the secret flags, as the command line or the variables set
// them, and the AWS secret keys of the environment.
func (g *globals) secrets() []string {
	var out []string
	if g != nil {
		for name, value := range map[string]string{
			"redis-url": g.redisURL, "redis-cluster": g.redisCluster, "pg-url": g.pgURL,
			"mysql-dsn": g.mysqlDSN, "dynamo-endpoint": g.dynamoEndpoint,
		} {
			out = append(out, secretsIn(name, value)...)
		}
	}
	for name := range secretFlags {
		out = append(out, secretsIn(name, os.Getenv(envVar(name)))...)
	}
	for _, v := range secretVariables {
		if s := os.Getenv(v); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// scrub replaces every secret in s, the longest first, so that a secret
// holding a shorter one is replaced whole.
func scrub(s string, secrets []string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, secret := range secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, mask)
		}
	}
	return s
}

// scrubbedError is an error whose message is scrubbed of secrets; it
// unwraps to the error, so that its exit code and kind still show.
type scrubbedError struct {
	err     error
	secrets []string
}

func (e scrubbedError) Error() string { return scrub(e.err.Error(), e.secrets) }
func (e scrubbedError) Unwrap() error { return e.err }
