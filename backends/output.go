package backends

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The produced messages of a completed handler are stored with its
// completion record in this format, so a duplicate can replay them:
//
//	version byte (1)
//	uvarint message count
//	per message: string UUID, uvarint metadata count, (string key,
//	string value)..., bytes payload
//
// where string and bytes are a uvarint length followed by the bytes.
// Metadata is stored in map order: the order carries no meaning.
const outputVersion = 1

// ErrCorruptOutput is returned by [DecodeOutput] for bytes that are not an
// encoded output.
var ErrCorruptOutput = errors.New("backends: corrupt stored output")

// EncodeOutput encodes a handler's produced messages the way they are
// stored with a completion, so that a duplicate can replay them: nil for
// no messages. The middleware calls it; so does the CompleteTx of
// pgstore and mysqlstore, which complete a key in the caller's
// transaction.
func EncodeOutput(msgs []*message.Message) []byte {
	if len(msgs) == 0 {
		return nil
	}
	size := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, outputVersion)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = appendString(b, m.UUID)
		b = binary.AppendUvarint(b, uint64(len(m.Metadata)))
		for k, v := range m.Metadata {
			b = appendString(b, k)
			b = appendString(b, v)
		}
		b = binary.AppendUvarint(b, uint64(len(m.Payload)))
		b = append(b, m.Payload...)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeOutput decodes an output stored with a completion
// ([AcquireResult.Output], [Record.Output]) back into messages, or returns
// an error wrapping [ErrCorruptOutput]. Each call returns fresh messages:
// they are published, and a publisher may modify them.
func DecodeOutput(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	d := decoder{b: b}
	if v := d.byte(); v != outputVersion {
		return nil, fmt.Errorf("%w: unknown version %d", ErrCorruptOutput, v)
	}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) { // each message takes at least one byte
		d.err = fmt.Errorf("%w: %d messages in %d bytes", ErrCorruptOutput, n, len(d.b))
	}
	msgs := make([]*message.Message, 0, min(n, 1024))
	for i := uint64(0); i < n && d.err == nil; i++ {
		m := message.NewMessage(d.string(), nil)
		nmeta := d.uvarint()
		if nmeta > 0 && d.err == nil && nmeta <= uint64(len(d.b)) {
			m.Metadata = make(message.Metadata, nmeta)
		}
		for j := uint64(0); j < nmeta && d.err == nil; j++ {
			k := d.string()
			m.Metadata[k] = d.string()
		}
		m.Payload = d.bytes()
		msgs = append(msgs, m)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrCorruptOutput, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return msgs, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated", ErrCorruptOutput)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := make([]byte, n)
	copy(v, d.b)
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }
