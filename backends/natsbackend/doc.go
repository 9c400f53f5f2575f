// Package natsbackend is the NATS JetStream broker of package backends.
// Imported for its side effect, it registers the broker, and backends.New
// then builds a Publisher and Subscriber for
// nats://[user:pass@]host:4222[,host2:4222]:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
//
// It links watermill-nats and nats.go, which a program that does not import
// it does without; New refuses a nats:// URL there with
// backends.ErrBrokerNotLinked.
//
// The settings named below (Group, Consumer, NackResendSleep and the NATS
// section) are fields of backends.Config, which holds every broker's
// settings so that one Config, and backends.FromEnv, serves them all.
//
// Publishing goes through watermill-nats; subscribing through this package's
// own JetStream subscriber, because watermill-nats's closes its output
// channel while a message callback may still send on it.
//
// Each topic is a subject captured by a stream: one the operator created, or
// else one the backend creates on first use (and again on a publish after
// it was deleted), named after the topic, with
// JetStream's defaults (file storage, limits retention, no size or age
// limit, 2-minute duplicate window). Publishes carry no Nats-Msg-Id, so
// JetStream drops nothing as a duplicate: a message republished with its
// UUID (Watermill's requeuer) is delivered again, and the idempotency
// middleware, not the broker, deduplicates. The publisher reads every
// PubAck: a message whose metadata sets Nats-Msg-Id and that JetStream
// drops as a duplicate is a backends.ErrDuplicatePublish, not a success.
//
// Each group reads a topic through a durable push consumer named
// group_topic, with a deliver group of the same name, which the backend
// creates before subscribing: explicit acks, AckWait of NATS.AckWait (60 s,
// above the idempotency lease: a dead consumer's key is then free by the time
// its message comes back),
// MaxAckPending of NATS.MaxAckPending (100; messages buffered in a client
// beyond what it handles within AckWait are redelivered elsewhere), delivery
// from the start of the stream. Messages are acked manually once the handler
// acks: without nats.ManualAck, nats.go acks each message as soon as the
// callback returns, before the handler has run, and a crash loses it.
// Headers become metadata as watermill-nats reads them, except that a
// header with several values (JetStream allows it; watermill-nats rejects
// the message, which was then terminated unseen) becomes one value, the
// values joined with ", " in order.
//
// Shutdown keeps the durable. nats.go deletes a consumer on Unsubscribe or
// Drain when the subscription created it, so a durable created by the first
// member of a group would vanish when that member stops, cutting off the
// others, and the next start would replay the whole stream. Because the
// backend creates the durable itself, subscriptions only bind to it, and it
// survives every shutdown with the group's position: a restarted group
// resumes after its last ack. Delete the durable (nats consumer rm) when a
// group is retired, after its last member stopped: a running member creates
// it again (see below). On Close a message held but not yet acked is nacked
// at once, so another member takes it without waiting for AckWait.
//
// A running subscriber checks every 5 s that its durable exists: JetStream
// does not tell a push consumer's subscribers that it was deleted. When the
// topic's stream was deleted, the durable went with it; the subscriber then
// creates the stream (unless a publish did already) and the durable again,
// and subscribes anew. The messages the deleted stream held are gone with
// it, acked or not, but for one a handler already had; that one is not
// acked, nacked or extended any more, since the new stream numbers its
// messages from 1 again and the ack would settle the new message of the
// same number. A durable that another process created again is noticed at
// the next check too, by its creation time, and the subscriber subscribes
// anew; an ack sent before that check can still settle, and so lose, a
// message of the new stream. Everything published
// to the new stream is delivered, also what came before the subscriber
// noticed: the new durable reads the stream from its start. A durable
// deleted alone is created again the same way, and the group then reads its
// stream again from the start, as after a restart; the idempotency
// middleware acks what it completed within CompletedTTL as duplicates.
//
// A nacked message is redelivered by the server after NackResendSleep
// (NakWithDelay), without holding back the messages behind it. When a
// handler receives a message, and every third of AckWait while it works on
// it, the subscriber sends a progress ack (InProgress), so a slow handler is
// neither redelivered nor interrupted, however long it runs, and neither is
// a message that waited in the client behind a slow predecessor (its
// AckWait restarts when its handler receives it; before, the first progress
// ack came AckWait/3 later, and a message that had waited more than two
// thirds of AckWait was redelivered while its handler ran). A message held
// by a consumer that died, or that waited in the client for longer than
// AckWait before any handler took it, is redelivered by the server after
// AckWait. Reconnects never give up (nats.go's default
// stops after 60 attempts).
package natsbackend
