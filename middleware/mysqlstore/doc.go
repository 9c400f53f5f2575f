// Package mysqlstore is the MySQL and MariaDB implementation of
// idempotency.Store, on database/sql with github.com/go-sql-driver/mysql,
// for MySQL 8.0+ and MariaDB 10.6+ with InnoDB.
package mysqlstore
