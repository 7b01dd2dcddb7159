-- A slot can hold more than one running row: the row its handler works on,
-- and rows whose handlers are done while their outcomes wait to be recorded
-- (pgworker run lets 64 wait a process, or as many as its slots if more).
-- files.active_workers shows a line for each; its comments said that the
-- slot was working on every one of them.

-- +goose Up
COMMENT ON COLUMN files.active_workers.file_id IS
    'A running row the slot holds: the one its handler works on, or one whose handler is done and whose outcome waits '
    'to be recorded; NULL when idle.';
COMMENT ON COLUMN files.active_workers.running_for IS 'How long ago the slot claimed that row.';

-- +goose Down
COMMENT ON COLUMN files.active_workers.file_id IS 'The row the slot is working on, NULL when idle.';
COMMENT ON COLUMN files.active_workers.running_for IS 'How long the slot has been working on that row.';
