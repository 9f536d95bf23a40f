-- Reverse of 0012_statistics: the checks go; the table goes with Django's reverse of the model.
ALTER TABLE pgmb_statistics
    DROP CONSTRAINT pgmb_statistics_whole_hour,
    DROP CONSTRAINT pgmb_statistics_counts,
    DROP CONSTRAINT pgmb_statistics_top_errors_array;
