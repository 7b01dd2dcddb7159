package migrations

import (
	"unicode"
	"unicode/utf8"
)

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

// MaxBatchNameLength is the most characters a batch name may have (CHECK
// files_batch_valid of files.files, batches_batch_valid of files.batches).
const MaxBatchNameLength = 128

// ValidBatchName reports whether files.files and files.batches accept name
// as a batch: 1 to MaxBatchNameLength characters, none of them a control
// character.
func ValidBatchName(name string) bool {
	if name == "" || utf8.RuneCountInString(name) > MaxBatchNameLength {
		return false
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
