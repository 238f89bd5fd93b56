package middleware

import (
	"bytes"
	crand "crypto/rand"
	"crypto/sha256"
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
	if err != nil {
		return "", &KeyError{MessageUUID: msg.UUID, Err: err}
	}
	return m.fullKey(ns, k, msg.UUID)
}

// fullKey returns ns + ":" + k, or a *KeyError (for the message uuid, if
// any) if either is empty or the whole is longer than Config.MaxKeyBytes.
func (m *Idempotency) fullKey(ns, k, uuid string) (string, error) {
	var err error
	switch {
	case ns == "":
		err = ErrNoNamespace
	case k == "":
		err = errors.New("the key is empty")
	case len(ns)+1+len(k) > m.cfg.MaxKeyBytes:
		err = fmt.Errorf("%w: %d bytes, the limit is %d", ErrKeyTooLong, len(ns)+1+len(k), m.cfg.MaxKeyBytes)
	default:
		return ns + ":" + k, nil
	}
	return "", &KeyError{MessageUUID: uuid, Err: err}
}

// fingerprint returns msg's fingerprint as the store records it (see
// fingerprintBytes). It is nil without a Fingerprint extractor or a value
// from it.
func (m *Idempotency) fingerprint(msg *message.Message) []byte {
	if m.cfg.Fingerprint == nil {
		return nil
	}
	fp, err := m.cfg.Fingerprint.Key(msg)
	if err != nil {
		return nil
	}
	return fingerprintBytes(fp)
}

// fingerprintBytes returns fp as the store records it: as it is, or its
// SHA-256 if it is longer than backends.MaxFingerprintBytes; nil if empty.
func fingerprintBytes(fp string) []byte {
	switch {
	case fp == "":
		return nil
	case len(fp) > backends.MaxFingerprintBytes:
		sum := sha256.Sum256([]byte(fp))
		return sum[:]
	}
	return []byte(fp)
}

// mismatched reports whether the key's record was first acquired with
// another fingerprint, and notes it in the event.
func (m *Idempotency) mismatched(d *delivery, res backends.AcquireResult) bool {
	if d.fp == nil || res.Fingerprint == nil || bytes.Equal(d.fp, res.Fingerprint) {
		return false
	}
	d.ev.FingerprintMismatch = true
	return true
}
