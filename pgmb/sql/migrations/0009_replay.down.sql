-- Reverse of 0009_replay. Deliveries it created stay: they are ordinary deliveries.
DROP FUNCTION pgmb.replay(uuid[], text[]);
