package pgstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SessionTimeoutParam is the PostgreSQL setting that ApplyPoolSettings sets.
const SessionTimeoutParam = "idle_in_transaction_session_timeout"

// ApplyPoolSettings sets on cfg, the pool's config, what the transactional
// completion (CompleteInTx) asks of the pool's sessions, given lease, the
// idempotency lease (zero meaning OnceConfig's default, 40 s):
// idle_in_transaction_session_timeout at half the lease, sent at every
// connect as a runtime parameter, so that a consumer stalled between its
// completion and its COMMIT has its session ended, its transaction rolled
// back and the key's row lock released well before another consumer may
// claim the key. A value already in cfg (from the connection string's
// options, say) is kept. It returns an error for a negative lease.
//
//	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
//	err = pgstore.ApplyPoolSettings(cfg, idemCfg.LeaseTTL)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// Set TCP keepalives (the connection string's keepalives options) too, so
// that a cut connection is noticed.
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
	if _, set := params[SessionTimeoutParam]; !set {
		params[SessionTimeoutParam] = strconv.FormatInt(max(lease/2, time.Millisecond).Milliseconds(), 10) // milliseconds
	}
	return nil
}
