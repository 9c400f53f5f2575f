package storekit

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOutputRoundTrip(t *testing.T) {
	a := message.NewMessage("uuid-a", []byte("\x00payload\xff"))
	a.Metadata.Set("k", "v")
	a.Metadata.Set("", "empty key")
	b := message.NewMessage("", nil)
	for _, msgs := range [][]*message.Message{nil, {a}, {a, b}} {
		enc := EncodeOutput(msgs)
		got, stored, err := DecodeOutput(enc)
		require.NoError(t, err)
		assert.True(t, stored)
		require.Len(t, got, len(msgs))
		for i := range msgs {
			assert.Equal(t, msgs[i].UUID, got[i].UUID)
			assert.Equal(t, string(msgs[i].Payload), string(got[i].Payload))
			assert.Equal(t, len(msgs[i].Metadata), len(got[i].Metadata))
			for k, v := range msgs[i].Metadata {
				assert.Equal(t, v, got[i].Metadata[k])
			}
		}
		assert.Equal(t, enc, EncodeOutput(got), "the encoding is deterministic")
	}
}

func TestOutputDecodeRejectsCorruption(t *testing.T) {
	a := message.NewMessage("uuid-a", []byte("payload"))
	enc := EncodeOutput([]*message.Message{a})
	for i := 1; i < len(enc); i++ {
		_, _, err := DecodeOutput(enc[:i])
		assert.Error(t, err, "truncated at %d", i)
	}
	_, _, err := DecodeOutput(append(append([]byte{}, enc...), 0))
	assert.Error(t, err, "trailing bytes")
	_, _, err = DecodeOutput([]byte{9})
	assert.Error(t, err, "unknown format")
	_, _, err = DecodeOutput([]byte{outputMessages, 0xff, 0xff, 0xff, 0xff, 0x0f})
	assert.Error(t, err, "absurd count")
	_, stored, err := DecodeOutput([]byte{OutputOmitted})
	require.NoError(t, err)
	assert.False(t, stored)
}

func FuzzDecodeOutput(f *testing.F) {
	f.Add(EncodeOutput([]*message.Message{message.NewMessage("u", []byte("p"))}))
	f.Add([]byte{outputMessages, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, stored, err := DecodeOutput(b)
		if err == nil && stored && len(b) > 0 {
			assert.Equal(t, b, EncodeOutput(msgs))
		}
	})
}

// TestOutputDecodeCopies: the decoded messages own their bytes, so that a
// handler's caller changing them never changes a cached result.
func TestOutputDecodeCopies(t *testing.T) {
	a := message.NewMessage("uuid-a", []byte("payload"))
	a.Metadata.Set("k", "v")
	enc := EncodeOutput([]*message.Message{a})
	want := append([]byte(nil), enc...)
	got, _, err := DecodeOutput(enc)
	require.NoError(t, err)
	for i := range got[0].Payload {
		got[0].Payload[i] = 'X'
	}
	got[0].Payload = append(got[0].Payload, "more"...)
	assert.Equal(t, want, enc)
}
