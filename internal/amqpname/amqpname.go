// Package amqpname names what package amqpbackend declares in RabbitMQ, for
// that package and for the tools that find or delete it: the fanout
// exchange of a topic, and the durable queue of a topic and a consumer
// group.
//
// The exchange is the topic. The queue is the topic, '_' and the group with
// '%' written as %25 and '_' as %5F: the last '_' ends the topic, so two
// (topic, group) pairs never share a queue. Topic "X_eu" with group
// "billing" is X_eu_billing; topic "X" with group "eu_billing" is
// X_eu%5Fbilling.
//
// RabbitMQ takes names of up to 255 bytes (amqp091 cuts a longer one at
// its length modulo 256, without a word). A name longer than 238 bytes is
// cut to its first 238, fewer to end on a whole UTF-8 character, followed
// by '_' and 16 hex digits of a SHA-256 of what it names: 252 to 255
// bytes, so that a cut name is never the whole name of another topic or
// pair.
package amqpname

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// maxLen is the longest name RabbitMQ takes, in bytes; keepLen the longest
// kept whole, what a cut name keeps of the whole one.
const (
	maxLen  = 255
	keepLen = maxLen - 1 - 16
)

var escaper = strings.NewReplacer("%", "%25", "_", "%5F")

// Exchange returns the exchange of topic.
func Exchange(topic string) string { return fit(topic, topic) }

// Queue returns the queue of group on topic.
func Queue(topic, group string) string {
	return fit(topic+"_"+escaper.Replace(group), topic, group)
}

// fit returns name if RabbitMQ takes it, and otherwise its beginning and a
// hash of parts, which name stands for.
func fit(name string, parts ...string) string {
	if len(name) <= keepLen {
		return name
	}
	h := sha256.New()
	for _, p := range parts {
		_ = binary.Write(h, binary.BigEndian, uint64(len(p)))
		h.Write([]byte(p))
	}
	cut := keepLen
	for back := 0; back < utf8.UTFMax-1 && !utf8.RuneStart(name[cut]); back++ {
		cut--
	}
	return name[:cut] + "_" + hex.EncodeToString(h.Sum(nil)[:8])
}
