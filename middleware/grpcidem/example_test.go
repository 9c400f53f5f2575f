package grpcidem_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// A server whose Charge method is idempotent per key, and a client whose
// application repeats a call with the same key: the handler runs once, and
// the repeat gets the replay.
func Example() {
	store := memstore.New(nil)
	// One Once per process: the store, the lease, the TTLs, the cache.
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	if err != nil {
		panic(err)
	}
	idem, err := grpcidem.New(once, &grpcidem.Config{
		Methods:      []string{"/grpcidem.test.v1.Ledger/Charge"},
		SingleTenant: true, // a real service scopes keys by its caller: Config.Scope
	})
	if err != nil {
		panic(err)
	}
	ledger := newLedger()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idem.UnaryServerInterceptor))
	testpb.RegisterLedgerServer(srv, ledger)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	client := &grpcidem.Client{}
	conn, err := grpc.NewClient(ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ledgerClient := testpb.NewLedgerClient(conn)

	ctx := grpcidem.WithKey(context.Background(), "order-42")
	for range 2 {
		var header metadata.MD
		reply, err := ledgerClient.Charge(ctx, &testpb.ChargeRequest{Amount: 1000}, grpc.Header(&header))
		if err != nil {
			panic(err)
		}
		fmt.Printf("run %d, amount %d, replayed %v\n", reply.Run, reply.Amount, header.Get(grpcidem.ReplayedMetadata))
	}
	fmt.Println("handler runs:", ledger.runs.Load())
	// Output:
	// run 1, amount 1000, replayed []
	// run 1, amount 1000, replayed [true]
	// handler runs: 1
}
