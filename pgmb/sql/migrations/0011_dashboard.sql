-- pgmb 0011: the dashboard. Its unrouted messages per minute read the last hour of
-- pgmb_message, which had no index on its time: a block-range (BRIN) index of created_at
-- finds that hour's pages without a scan of the table (rows are appended in time order),
-- and costs publishing next to nothing: an insert into the last range, not summarized yet,
-- writes nothing to the index; autovacuum summarizes a range once it is full. On a big
-- table, create it beforehand with CREATE INDEX CONCURRENTLY under this name: this
-- migration then keeps it.
CREATE INDEX IF NOT EXISTS pgmb_message_created_brin ON pgmb_message
    USING brin (created_at) WITH (autosummarize = on);
