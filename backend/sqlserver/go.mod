module github.com/fenced-dev/fenced/backend/sqlserver

go 1.26.8

require (
	github.com/fenced-dev/fenced v0.0.0-00010101000000-000000000000
	github.com/microsoft/go-mssqldb v1.11.2
	go.uber.org/goleak v1.3.0
)

require (
	github.com/golang-sql/civil v0.0.0-20220223132316-b832511892a9 // indirect
	github.com/golang-sql/sqlexp v0.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/shopspring/decimal v1.4.0 // indirect
	golang.org/x/crypto v0.55.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace github.com/fenced-dev/fenced => ../..
