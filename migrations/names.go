package migrations

import "unicode/utf8"

// Names and rules of schema files that Go code shares with the SQL. The
// migrations are their source; TestSharedNames fails when these and the
// catalog disagree. The channel names live with the listener
// (listener.ChannelPending, listener.ChannelControl), the default lease with
// the worker (worker.DefaultLeaseTimeout).

// MaxQueueNameLength is the most characters a queue name may have (CHECK
// files_queue_valid of files.files, queues_queue_valid of files.queues).
const MaxQueueNameLength = 128

// ValidQueueName reports whether files.files and files.queues accept name as
// a queue: 1 to MaxQueueNameLength characters.
func ValidQueueName(name string) bool {
	return name != "" && utf8.RuneCountInString(name) <= MaxQueueNameLength
}

// The states of a row of files.files (CHECK files_state_valid).
const (
	StatePending   = "pending"   // waiting, or scheduled for a retry at run_after
	StateRunning   = "running"   // held by a worker slot
	StateDone      = "done"      // completed
	StateFailed    = "failed"    // failed for good
	StateCancelled = "cancelled" // cancelled by an operator
)
