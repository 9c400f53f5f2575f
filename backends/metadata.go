package backends

// MetadataUndecodable is the metadata key set on a message whose broker
// record could not be decoded in full; its value says what was left out. The
// message is handed to the handler anyway (with what could be read), never
// dropped and never redelivered in a loop that no handler sees, so that the
// handler, the idempotency middleware or a PoisonQueue decides its fate.
// Only the Redis Streams backend (package redisbackend) sets it, for an
// entry whose metadata field is not the msgpack map Watermill writes. It is
// declared here so that a handler reads it without linking a broker.
const MetadataUndecodable = "_backends_undecodable"
