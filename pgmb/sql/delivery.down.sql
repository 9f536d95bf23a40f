DROP FUNCTION IF EXISTS pgmb.next_wakeup(text[]);
DROP FUNCTION IF EXISTS pgmb.requeue(text);
DROP FUNCTION IF EXISTS pgmb.requeue(bigint[]);
DROP FUNCTION IF EXISTS pgmb.reclaim_expired(integer);
DROP FUNCTION IF EXISTS pgmb.fail(bigint[], uuid[], integer[], text[], float8[], float8[]);
DROP FUNCTION IF EXISTS pgmb.settle_failures(bigint[], uuid[], integer[], text[], float8[], float8[], text);
DROP FUNCTION IF EXISTS pgmb.ack(bigint[], integer[], float8[]);
DROP FUNCTION IF EXISTS pgmb.claim(text[], integer, float8);
DROP FUNCTION IF EXISTS pgmb.retry_delay(integer, float8, float8, float8);
