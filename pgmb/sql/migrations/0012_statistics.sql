-- pgmb 0012: hourly delivery statistics. The table pgmb_statistics is Django's
-- (pgmb.models.HourlyStatistics); the Spark pipeline's stats job fills it with one upsert
-- (pgmb/sql/queries/statistics.sql) and pgmb.statistics reads it. These checks keep its
-- rows what the readers assume: whole UTC hours, and counts that add up.

ALTER TABLE pgmb_statistics
    -- Immutable (AT TIME ZONE 'UTC', not the session's zone): an hour bucket is the same
    -- whatever the writer's time zone.
    ADD CONSTRAINT pgmb_statistics_whole_hour
        CHECK (date_trunc('hour', hour AT TIME ZONE 'UTC') = hour AT TIME ZONE 'UTC'),
    ADD CONSTRAINT pgmb_statistics_counts
        CHECK (delivered >= 0 AND failed >= 0 AND attempts = delivered + failed
               AND retried >= 0 AND dead_lettered >= 0 AND expired >= 0
               AND retried + dead_lettered + expired <= failed),
    ADD CONSTRAINT pgmb_statistics_top_errors_array CHECK (jsonb_typeof(top_errors) = 'array');
