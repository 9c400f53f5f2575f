// Command mysql-ledger is the sibling of postgres-ledger on MySQL or
// MariaDB: a Watermill consumer that books payments into a ledger table,
// exactly once, even when it is killed in the middle of a booking. The
// idempotency records live in the same database (mysqlstore), and the
// handler writes its ledger row and the payment's COMPLETED record in one
// READ COMMITTED transaction (mysqlstore's CompleteInTx): both commit or
// neither does. A consumer killed before the commit leaves no row and an
// IN_PROGRESS key whose lease lapses, so the redelivery books it; one killed
// after the commit leaves a COMPLETED key, so the redelivery is a duplicate.
// A consumer that lost its lease cannot commit its row at all.
//
//	go run ./examples/mysql-ledger                      # publish, then consume
//	go run ./examples/mysql-ledger publish              # only publish
//	go run ./examples/mysql-ledger consume              # only consume
//
// With no argument it publishes PAYMENTS payments (default 100), each twice
// (a producer's retry: a new UUID, the same requestId), consumes every
// delivery, and checks the ledger. "consume" books payments until every one
// of the PAYMENTS payments is in the ledger, then checks it; together with
// "publish", it lets a consumer be killed and restarted on a durable broker
// (its test does so, on Redis Streams). The last line is the check:
//
//	booked=100 duplicates=100
//	OK: 100 of 100 payments booked exactly once
//
// Run it again and it books nothing: every payment is a duplicate of a key
// that is COMPLETED for 24 hours. The settings, all from the environment:
//
//	BROKER_URL         the broker (default gochannel://); see package backends
//	                   for the other BROKER_* settings; BROKER_GROUP defaults
//	                   to "mysql-ledger"
//	MYSQL_URL          mysql://root@127.0.0.1:3306/test (mysqlstore.ParseURL)
//	PAYMENTS           how many payments, payment-0001 onwards (default 100)
//	PAYMENTS_TOPIC     the topic (default "payments")
//	LEDGER_TABLE       the ledger, created if missing (default "ledger")
//	IDEMPOTENCY_TABLE  the store's table, created by Migrate
//	                   (default "idempotency_keys")
//	LEASE_TTL          the middleware's lease, a Go duration (default 40s)
//
// The ledger table has no unique constraint on the payment id, on purpose:
// a payment booked twice would show as two rows, and the check would say so.
package main
