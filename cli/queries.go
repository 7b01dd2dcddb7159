package cli

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// explain adds what to do to the database errors that have an obvious fix.
func explain(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "3F000", "42P01", "42883": // no schema, table or function
		return fmt.Errorf("%w (is the files schema installed? run 'pgworker migrate up')", err)
	case "42501": // insufficient privilege
		return fmt.Errorf("%w (grant this database user the pgworker_admin role, or pgworker_reader for status)", err)
	}
	return err
}
