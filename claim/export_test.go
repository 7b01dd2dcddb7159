package claim

import (
	"context"
	"slices"
)

// Claim sends one claim query, as Run does on a wake-up: at most one row for
// each of workerIDs. A lost race returns no rows and a nil error. Tests call
// it to look at one claim without a running loop; the rows are theirs to
// keep.
func (c *Claimer) Claim(ctx context.Context, workerIDs []string) ([]Row, error) {
	if len(workerIDs) == 0 {
		return nil, nil
	}
	rows, _, err := c.claim(ctx, workerIDs)
	if err != nil && !RaceLost(err) {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return slices.Clone(rows), nil
}
