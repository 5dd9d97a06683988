package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/txhook/txhook/migrations"
)

const migrateUsage = `migrate up | down [N] | down --all [--yes] | version

  up        apply every migration not yet applied
  down [N]  roll back the N most recent migrations (default 1)
  down --all [--yes]
            roll back every migration: drops txhook's tables and the events in
            them, after a question on the terminal (or with --yes)
  version   print the applied and the latest migration version`

func runMigrate(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("migrate", migrateUsage)
	all := fs.Bool("all", false, "with down: roll back every migration")
	yes := fs.Bool("yes", false, "with down --all: do not ask for confirmation")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand: up, down or version")
	}
	if *all && pos[0] != "down" {
		return usagef("--all goes with down only")
	}
	if *yes && !*all {
		return usagef("--yes goes with down --all only")
	}
	switch sub, rest := pos[0], pos[1:]; sub {
	case "up":
		if len(rest) > 0 {
			return usagef("up takes no arguments")
		}
		u, err := c.url()
		if err != nil {
			return err
		}
		if err := migrations.Up(ctx, u); err != nil {
			return err
		}
		return c.printVersion(ctx, u)
	case "down":
		n := 1
		switch {
		case *all && len(rest) > 0:
			return usagef("down takes N or --all, not both")
		case *all:
			n = 0
		case len(rest) > 1:
			return usagef("down takes at most one argument")
		case len(rest) == 1:
			n, err = strconv.Atoi(rest[0])
			if err != nil || n < 1 {
				return usagef("down: N must be a positive number, got %q", rest[0])
			}
		}
		u, err := c.url()
		if err != nil {
			return err
		}
		if *all && !*yes {
			if err := c.confirm("migrate down --all drops txhook's tables and every event in them", "--yes"); err != nil {
				return err
			}
		}
		if err := migrations.Down(ctx, u, n); err != nil {
			return err
		}
		return c.printVersion(ctx, u)
	case "version":
		if len(rest) > 0 {
			return usagef("version takes no arguments")
		}
		u, err := c.url()
		if err != nil {
			return err
		}
		return c.printVersion(ctx, u)
	default:
		return usagef("unknown subcommand %q: want up, down or version", sub)
	}
}

func (c *cli) printVersion(ctx context.Context, u string) error {
	v, dirty, err := migrations.Version(ctx, u)
	if err != nil {
		return err
	}
	latest, err := migrations.Latest()
	if err != nil {
		return err
	}
	state := "up to date"
	switch {
	case dirty:
		state = "dirty: a migration failed halfway; repair the schema, then force the version with golang-migrate"
	case v > latest:
		state = "newer than this txhook"
	case v < latest:
		state = "pending migrations: run " + c.name + " migrate up"
	}
	fmt.Fprintf(c.stdout, "version %d (latest %d, %s)\n", v, latest, state)
	if dirty {
		return fmt.Errorf("schema version %d is dirty", v)
	}
	return nil
}
