package main

import (
	"errors"
	"net/url"
	"strings"
)

// config is the example's configuration, read from the environment.
type config struct {
	// DatabaseURL is the PostgreSQL connection string (DATABASE_URL).
	DatabaseURL string
	// WebhookSecret is the endpoint's signing secret, whsec_... in Stripe's
	// dashboard (STRIPE_WEBHOOK_SECRET).
	WebhookSecret string
	// Addr is the address to listen on (ADDR). Defaults to 127.0.0.1:8080.
	Addr string
	// FulfillmentURL, when set, is where payment_intent.succeeded events are
	// sent for fulfillment (FULFILLMENT_URL). Optional.
	FulfillmentURL string
	// ConsolePassword, when set, mounts txhook's operator console at
	// /txhook/ behind HTTP basic auth, user admin, with this password
	// (CONSOLE_PASSWORD). Optional: without it there is no console.
	ConsolePassword string
	// AMQPURL, when set, is a RabbitMQ broker whose queue orders the
	// example also consumes (AMQP_URL): each message a Stripe event, its id
	// in the message-id property and its type in the type property.
	// Optional.
	AMQPURL string
	// NATSURL, when set, makes the example also apply the events published
	// to the JetStream stream ORDERS (NATS_URL; see nats.go). Optional.
	NATSURL string
}

// defaultAddr is the listen address when ADDR is unset.
const defaultAddr = "127.0.0.1:8080"

// loadConfig reads the configuration through getenv (os.Getenv). Its error
// names every missing or invalid setting, so that one run shows them all.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL:    strings.TrimSpace(getenv("DATABASE_URL")),
		WebhookSecret:  strings.TrimSpace(getenv("STRIPE_WEBHOOK_SECRET")),
		Addr:           strings.TrimSpace(getenv("ADDR")),
		FulfillmentURL: strings.TrimSpace(getenv("FULFILLMENT_URL")),
		// Not trimmed: a password's spaces are its own.
		ConsolePassword: getenv("CONSOLE_PASSWORD"),
		AMQPURL:         strings.TrimSpace(getenv("AMQP_URL")),
		NATSURL:         strings.TrimSpace(getenv("NATS_URL")),
	}
	if c.Addr == "" {
		c.Addr = defaultAddr
	}
	var problems []string
	if c.DatabaseURL == "" {
		problems = append(problems, "DATABASE_URL is required: the PostgreSQL connection string, e.g. postgres://app@127.0.0.1:5432/app")
	}
	if c.WebhookSecret == "" {
		problems = append(problems, "STRIPE_WEBHOOK_SECRET is required: the endpoint's signing secret (whsec_...) from Stripe's dashboard or `stripe listen`")
	}
	if c.FulfillmentURL != "" {
		u, err := url.Parse(c.FulfillmentURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			problems = append(problems, "FULFILLMENT_URL must be an http:// or https:// URL")
		}
	}
	if c.AMQPURL != "" {
		u, err := url.Parse(c.AMQPURL)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			problems = append(problems, "AMQP_URL must be an amqp:// or amqps:// URL, e.g. amqp://guest:guest@127.0.0.1:5672/")
		}
	}
	if len(problems) > 0 {
		return config{}, errors.New("invalid configuration:\n  - " + strings.Join(problems, "\n  - "))
	}
	return c, nil
}
