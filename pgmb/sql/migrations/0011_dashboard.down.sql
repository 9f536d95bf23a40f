DROP INDEX IF EXISTS pgmb_message_created_brin;
