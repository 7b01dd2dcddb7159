package migrations

import (
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
)

// NewProvider returns a goose provider that applies FS to db, a PostgreSQL
// database opened through the pgx stdlib driver. Run its Up against the primary.
func NewProvider(db *sql.DB, opts ...goose.ProviderOption) (*goose.Provider, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS, opts...)
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}
