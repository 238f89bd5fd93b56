package backends

import (
	"bytes"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

func TestOutputRoundTrip(t *testing.T) {
	a := message.NewMessage("a", []byte("payload\x00\xff"))
	a.Metadata.Set("k", "v")
	a.Metadata.Set("", "empty key")
	b := message.NewMessage("", nil)
	c := message.NewMessage("c", bytes.Repeat([]byte("x"), 1<<16))

	enc := EncodeOutput([]*message.Message{a, b, c})
	got, err := DecodeOutput(enc)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i, want := range []*message.Message{a, b, c} {
		require.Equal(t, want.UUID, got[i].UUID)
		require.True(t, bytes.Equal(want.Payload, got[i].Payload))
		require.Equal(t, len(want.Metadata), len(got[i].Metadata))
		for k, v := range want.Metadata {
			require.Equal(t, v, got[i].Metadata[k])
		}
	}

	again, err := DecodeOutput(enc)
	require.NoError(t, err)
	again[0].Payload[0] = 'X'
	require.Equal(t, byte('p'), got[0].Payload[0], "each decode returns fresh messages")

	require.Nil(t, EncodeOutput(nil))
	none, err := DecodeOutput(nil)
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestOutputDecodeRejectsCorruptInput(t *testing.T) {
	enc := EncodeOutput([]*message.Message{message.NewMessage("a", []byte("p"))})
	for name, b := range map[string][]byte{
		"unknown version": append([]byte{2}, enc[1:]...),
		"truncated":       enc[:len(enc)-1],
		"trailing bytes":  append(append([]byte{}, enc...), 0),
		"huge count":      {1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"huge length":     {1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f},
	} {
		_, err := DecodeOutput(b)
		require.ErrorIs(t, err, ErrCorruptOutput, name)
	}
}

func FuzzOutputDecode(f *testing.F) {
	f.Add(EncodeOutput([]*message.Message{message.NewMessage("a", []byte("p"))}))
	f.Add([]byte{1, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := DecodeOutput(b)
		if err != nil {
			return
		}
		// Whatever decodes survives an encode and decode unchanged.
		again, err := DecodeOutput(EncodeOutput(msgs))
		require.NoError(t, err)
		require.Len(t, again, len(msgs))
		for i := range msgs {
			require.Equal(t, msgs[i].UUID, again[i].UUID)
			require.True(t, bytes.Equal(msgs[i].Payload, again[i].Payload))
			require.Equal(t, len(msgs[i].Metadata), len(again[i].Metadata))
			for k, v := range msgs[i].Metadata {
				require.Equal(t, v, again[i].Metadata[k])
			}
		}
	})
}
