// Command idemctl inspects and repairs the keys of watermill-idempotency
// stores, Redis (redisstore), PostgreSQL (pgstore) and MySQL or MariaDB
// (mysqlstore), for the questions an operator has during an incident: why
// is this message never processed, which keys are stuck IN_PROGRESS and for
// how long, how many failed five times, can this one key run again, how
// much memory do completed keys take.
//
//	idemctl get     --store redis://localhost:6379/0 'idem:orders:req-42'
//	idemctl list    --store redis://localhost:6379/0 --prefix idem:orders: --state in_progress --age 5m
//	idemctl release --store postgres://app@db/app 'idem:orders:req-42'
//	idemctl get     --store mysql://app@db:3306/app 'idem:orders:req-42'
//	idemctl purge   --store redis://localhost:6379/0 --prefix idem:old-handler: --apply
//	idemctl stats   --store redis://localhost:6379/0 --prefix idem: --json
//	idemctl get     --store redis://localhost:6379/0 --http --scope alice 8e03978e
//
// Run idemctl --help for every command, flag and exit code.
//
// It reads and writes records only through one interface that every store
// implements (idempotency.Store, Records and DeleteIf), never by decoding
// the stored values itself, so it follows their format; counts are made
// from Records. Likewise an HTTP or gRPC key
// (get --http, --grpc) is built, and a stored response or answer decoded,
// by httpidem's and grpcidem's own code. Every command takes --json.
//
// What release does: it deletes the record of an IN_PROGRESS or FAILED key,
// in one atomic operation that checks the state (DeleteIf), so a key that
// completed meanwhile is left alone. The key is then ABSENT: the next
// delivery claims it as attempt 1, also when the key had reached
// MaxAttempts, and its stored fingerprint is forgotten. An owner that is
// still running the handler is fenced like any owner whose lease was taken:
// its next renewal gets ErrLeaseLost and cancels the handler's context, and
// its Complete reports lease_lost. A COMPLETED key is refused, because
// deleting it lets the next copy run the effect again; purge deletes it when
// that is what is wanted.
//
// Exit codes: 0 done, 1 failed (a corrupt record, an unexpected error), 2
// usage, 3 not found, 4 refused (not confirmed, or the key's state forbids
// it), 5 store down.
package main
