// Package migrations holds the goose migrations that build schema files: the
// work queue, its SQL API, the operator views and the roles.
//
// The goose CLI runs the folder as it is:
//
//	goose -dir migrations postgres "$DATABASE_URL" up
//
// Go programs use FS, for example with goose's provider:
//
//	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
package migrations

import "embed"

// FS holds the migration files (NNNNN_name.sql) at its root.
//
//go:embed *.sql
var FS embed.FS
