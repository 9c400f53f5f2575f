package pgstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const sessionTimeoutParam = "idle_in_transaction_session_timeout"

// ApplyPoolSettings sets idle_in_transaction_session_timeout to half of
// lease on cfg's sessions (a zero lease means the default, 40 s), unless cfg
// sets it. A consumer stalled before its COMMIT then has its transaction
// rolled back and the row lock released before another may claim the key.
// A negative lease is an error.
//
//	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
//	err = pgstore.ApplyPoolSettings(cfg, idemCfg.LeaseTTL)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// Set TCP keepalives too, so that a cut connection is noticed.
func ApplyPoolSettings(cfg *pgxpool.Config, lease time.Duration) error {
	if cfg == nil {
		return fmt.Errorf("pgstore: ApplyPoolSettings: nil *pgxpool.Config")
	}
	if lease < 0 {
		return fmt.Errorf("pgstore: ApplyPoolSettings: negative lease %s", lease)
	}
	if lease == 0 {
		lease = 40 * time.Second // idempotency.OnceConfig's default LeaseTTL
	}
	params := cfg.ConnConfig.RuntimeParams
	if params == nil {
		params = map[string]string{}
		cfg.ConnConfig.RuntimeParams = params
	}
	if _, set := params[sessionTimeoutParam]; !set {
		params[sessionTimeoutParam] = strconv.FormatInt(max(lease/2, time.Millisecond).Milliseconds(), 10) // milliseconds
	}
	return nil
}
