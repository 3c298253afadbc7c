module github.com/fenced-dev/fenced/backend/mysql

go 1.26.8

require (
	github.com/fenced-dev/fenced v0.0.0-00010101000000-000000000000
	github.com/go-sql-driver/mysql v1.10.1
	go.uber.org/goleak v1.3.0
)

require filippo.io/edwards25519 v1.2.0 // indirect

replace github.com/fenced-dev/fenced => ../..
