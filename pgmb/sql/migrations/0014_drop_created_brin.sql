-- pgmb 0014: the block-range index of pgmb_message.created_at (0011, for the dashboard's
-- last hour) goes: 0013's B-tree pgmb_message_created (created_at, id) serves the same
-- range, and the planner prefers it, so the BRIN was one more index for every publish to
-- keep and nothing to read.
DROP INDEX IF EXISTS pgmb_message_created_brin;
