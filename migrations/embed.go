// Package migrations holds the goose migrations that build schema files: the
// tables of the work queue, its SQL API, the operator views, the roles and the
// scaling hint. README.md says how to add one; sql/schema.sql is the same
// schema as one script, and a test fails when the two differ.
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
