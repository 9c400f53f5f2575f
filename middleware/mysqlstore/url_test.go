package mysqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

func TestParseURL(t *testing.T) {
	cfg, err := mysqlstore.ParseURL("mysql://app:s3%2Fcr%3At@db.example:3307/orders?timeout=2s&innodb_lock_wait_timeout=5")
	require.NoError(t, err)
	assert.Equal(t, "app", cfg.User)
	assert.Equal(t, "s3/cr:t", cfg.Passwd)
	assert.Equal(t, "tcp", cfg.Net)
	assert.Equal(t, "db.example:3307", cfg.Addr)
	assert.Equal(t, "orders", cfg.DBName)
	assert.Equal(t, "2s", cfg.Timeout.String())
	assert.Equal(t, "5", cfg.Params["innodb_lock_wait_timeout"])

	cfg, err = mysqlstore.ParseURL("mariadb://root@127.0.0.1/test")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:3306", cfg.Addr, "the default port")
	assert.Equal(t, "root", cfg.User)
	assert.Empty(t, cfg.Passwd)

	for _, bad := range []string{"postgres://x/y", "mysql:///test", "mysql://h/db?timeout=soon", "::"} {
		_, err := mysqlstore.ParseURL(bad)
		assert.ErrorIs(t, err, mysqlstore.ErrInvalidURL, bad)
	}
}
