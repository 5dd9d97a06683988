// Package amqpconsumer applies the messages of a RabbitMQ queue exactly
// once to PostgreSQL through txhook's engine.
package amqpconsumer
