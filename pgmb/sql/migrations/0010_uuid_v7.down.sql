ALTER TABLE pgmb_message ALTER COLUMN id SET DEFAULT gen_random_uuid();
DROP FUNCTION pgmb.uuid_v7();
