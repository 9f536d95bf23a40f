-- pgmb's schema as (kind, name, definition) rows, from the catalogs: what two databases
-- must agree on to hold the same schema (the pgmb_* tables and everything in schema pgmb,
-- privileges included). Per-queue views (pgmb.<stem>_queue, made for each queue by a
-- trigger) are data, not schema, and are left out.
SELECT 'column', c.relname || '.' || a.attname,
       concat_ws(' ', format_type(a.atttypid, a.atttypmod), CASE WHEN a.attnotnull THEN 'NOT NULL' END,
                 'DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), nullif(a.attidentity, ''))
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid AND c.relkind = 'r'
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE (n.nspname = 'public' AND c.relname LIKE 'pgmb\_%' OR n.nspname = 'pgmb')
  AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', c.relname || '.' || k.conname, pg_get_constraintdef(k.oid) || CASE WHEN k.convalidated THEN '' ELSE ' (not validated)' END
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE c.relname LIKE 'pgmb\_%' AND c.relnamespace = 'public'::regnamespace
   OR c.relnamespace = 'pgmb'::regnamespace
UNION ALL
SELECT 'index', i.indexname, i.indexdef FROM pg_indexes i
WHERE i.schemaname = 'public' AND i.tablename LIKE 'pgmb\_%' OR i.schemaname = 'pgmb'
UNION ALL
SELECT 'statistics', s.stxname, pg_get_statisticsobjdef(s.oid)
FROM pg_statistic_ext s JOIN pg_class c ON c.oid = s.stxrelid
WHERE c.relname LIKE 'pgmb\_%' AND c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger', c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relname LIKE 'pgmb\_%' AND NOT t.tgisinternal
UNION ALL
SELECT 'routine', p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p
WHERE p.pronamespace = 'pgmb'::regnamespace
   OR (p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'pgtrigger\_%')
UNION ALL
SELECT 'view', c.relname, pg_get_viewdef(c.oid)
FROM pg_class c
WHERE c.relnamespace = 'pgmb'::regnamespace AND c.relkind = 'v' AND c.relname !~ '_queue$'
UNION ALL
SELECT 'type', t.typname || '.' || a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_type t
JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'
JOIN pg_attribute a ON a.attrelid = t.typrelid
WHERE t.typnamespace = 'pgmb'::regnamespace AND a.attnum > 0
UNION ALL
SELECT 'privileges', 'schema pgmb', n.nspacl::text FROM pg_namespace n WHERE n.nspname = 'pgmb'
UNION ALL
SELECT 'privileges', c.oid::regclass::text, c.relacl::text
FROM pg_class c
WHERE c.relacl IS NOT NULL AND c.relkind IN ('r', 'v')
  AND (c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'pgmb\_%'
       OR c.relnamespace = 'pgmb'::regnamespace AND c.relname !~ '_queue$')
UNION ALL
SELECT 'privileges', p.oid::regprocedure::text, p.proacl::text
FROM pg_proc p WHERE p.pronamespace = 'pgmb'::regnamespace AND p.proacl IS NOT NULL
ORDER BY 1, 2
