CREATE INDEX IF NOT EXISTS pgmb_message_created_brin ON pgmb_message
    USING brin (created_at) WITH (autosummarize = on);
