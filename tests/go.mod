module github.com/txhook/txhook/tests

go 1.26.0

replace github.com/txhook/txhook => ../

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/nats-io/nats.go v1.55.0
	github.com/riverqueue/river v0.51.2
	github.com/riverqueue/river/riverdriver/riverpgxv5 v0.51.2
	github.com/riverqueue/river/rivertype v0.51.2
	github.com/stripe/stripe-go/v82 v82.5.1
	github.com/txhook/txhook v0.0.0
	github.com/txhook/txhook/amqpconsumer v0.0.0-00010101000000-000000000000
	github.com/txhook/txhook/examples/stripe-orders v0.0.0
	github.com/txhook/txhook/inbox v0.0.0-00010101000000-000000000000
	github.com/txhook/txhook/natsconsumer v0.0.0
)

require (
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/riverqueue/river/riverdriver v0.51.2 // indirect
	github.com/riverqueue/river/rivershared v0.51.2 // indirect
	github.com/tidwall/gjson v1.20.0 // indirect
	github.com/tidwall/match v1.2.0 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

require (
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/golang-migrate/migrate/v4 v4.20.1 // indirect
	github.com/jackc/pgerrcode v0.0.0-20240316143900-6e2875d9b438 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/txhook/txhook/examples/github-pushes v0.0.0
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/txhook/txhook/examples/github-pushes => ../examples/github-pushes

replace github.com/txhook/txhook/examples/stripe-orders => ../examples/stripe-orders

replace github.com/txhook/txhook/inbox => ../inbox

replace github.com/txhook/txhook/amqpconsumer => ../amqpconsumer

replace github.com/txhook/txhook/natsconsumer => ../natsconsumer
