package middleware

import (
	"bytes"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-idempotency/idempotency/backends"
)

// Owner tokens are unique per delivery attempt: 64 random bits chosen once
// per process, then a counter. That is as unique as a random token per
// attempt and much cheaper.
var (
	ownerPrefix = func() string {
		b := make([]byte, 8)
		_, _ = crand.Read(b)
		return hex.EncodeToString(b) + "-"
	}()
	ownerSeq atomic.Uint64
)

func newOwner() string {
	var buf [40]byte
	b := append(buf[:0], ownerPrefix...)
	return string(strconv.AppendUint(b, ownerSeq.Add(1), 36))
}

// key returns msg's full key: the namespace (handler, the router's handler
// name, unless Config.Namespace is set), a colon, and the extracted key.
func (m *Idempotency) key(msg *message.Message, handler string) (string, error) {
	ns := m.cfg.Namespace
	if ns == "" {
		if ns = handler; ns == "" {
			return "", &KeyError{MessageUUID: msg.UUID, Err: ErrNoNamespace}
		}
	}
	k, err := m.cfg.Key.Key(msg)
	if err == nil && k == "" {
		err = errors.New("the extractor returned an empty key")
	}
	if err != nil {
		return "", &KeyError{MessageUUID: msg.UUID, Err: err}
	}
	full := ns + ":" + k
	if len(full) > m.cfg.MaxKeyBytes {
		return "", &KeyError{MessageUUID: msg.UUID, Err: fmt.Errorf("%w: %d bytes, the limit is %d", ErrKeyTooLong, len(full), m.cfg.MaxKeyBytes)}
	}
	return full, nil
}

func (m *Idempotency) mismatch(d *delivery, res backends.AcquireResult) bool {
	if d.fp == nil || res.Fingerprint == nil || bytes.Equal(d.fp, res.Fingerprint) {
		return false
	}
	d.ev.FingerprintMismatch = true
	return true
}
