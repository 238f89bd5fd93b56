package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// script is one of the store's Lua scripts. A call of it is one command,
// built once: EVALSHA with the script's SHA1, sent again as EVAL, with
// the script itself, to a server that does not have it (NOSCRIPT).
// go-redis's Script would build the command again from the keys and
// arguments on every call.
type script struct {
	src string
	sha any // the SHA1 in hex, boxed once for every command
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// command returns the EVALSHA command that runs s on key with argv.
func (s *script) command(key string, argv []any) []any {
	return append(append(make([]any, 0, 4+len(argv)), "evalsha", s.sha, "1", key), argv...)
}

// eval makes cmd, a command of s, send the script itself.
func (s *script) eval(cmd []any) []any {
	cmd[0], cmd[1] = "eval", s.src
	return cmd
}

// doer sends a command: a client or a pipeline.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// run sends cmd, a command of s, on c, and as EVAL if the server does not
// have s.
func (s *script) run(ctx context.Context, c doer, cmd []any) *redis.Cmd {
	reply := c.Do(ctx, cmd...)
	if noScript(reply.Err()) {
		reply = c.Do(ctx, s.eval(cmd)...)
	}
	return reply
}
