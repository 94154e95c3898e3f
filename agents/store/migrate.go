package store

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"strings"
	"testing/fstest"

	"github.com/pressly/goose/v3"
)

// The migrations are one sequence of versions for both engines. A file
// named NNNNN_name.sql is run on both; where the SQL must differ (SQLite's
// STRICT tables, json_valid and triggers), the version has one file per
// engine, NNNNN_name.sqlite.sql and NNNNN_name.postgres.sql.
//
//go:embed migrations/*.sql
var migrations embed.FS

// dialect is the database engine a Store runs on.
type dialect string

const (
	sqliteDialect   dialect = "sqlite"
	postgresDialect dialect = "postgres"
)

// migrationsFor returns the migration files d runs, named as goose
// expects (the engine's suffix dropped).
func migrationsFor(d dialect) (fs.FS, error) {
	entries, err := migrations.ReadDir("migrations")
	if err != nil {
		return nil, err
	}
	out := fstest.MapFS{}
	for _, e := range entries {
		name := e.Name()
		base := strings.TrimSuffix(name, ".sql")
		if i := strings.LastIndexByte(base, '.'); i >= 0 {
			if dialect(base[i+1:]) != d {
				continue
			}
			base = base[:i]
		}
		data, err := migrations.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		out[base+".sql"] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	return out, nil
}

// migrate brings the schema up to the newest embedded migration. It
// refuses a database whose schema is newer than this program knows:
// running an old binary against it could misread or damage it.
func migrate(ctx context.Context, db *sql.DB, d dialect) error {
	sub, err := migrationsFor(d)
	if err != nil {
		return err
	}
	gd := goose.DialectSQLite3
	if d == postgresDialect {
		gd = goose.DialectPostgres
	}
	p, err := goose.NewProvider(gd, db, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	current, target, err := p.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if current > target {
		return fmt.Errorf("%w: schema version %d, this program knows up to %d", ErrSchemaTooNew, current, target)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate schema from version %d: %w", current, err)
	}
	return nil
}

// SchemaVersion reports the version of the newest migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int64, error) {
	var v int64
	err := s.r.QueryRowContext(ctx, "SELECT COALESCE(MAX(version_id), 0) FROM goose_db_version WHERE is_applied").Scan(&v)
	return v, err
}
