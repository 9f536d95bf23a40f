-- Access control, as pgmb/access.py calls it (functions of schema/access.sql).

-- name: grant_publish_access
SELECT pgmb.grant_publish_access(role_name => %(role)s)

-- name: revoke_publish_access
SELECT pgmb.revoke_publish_access(role_name => %(role)s)

-- name: grant_queue_access
SELECT pgmb.grant_queue_access(queue_name => %(queue)s, role_name => %(role)s)

-- name: revoke_queue_access
SELECT pgmb.revoke_queue_access(queue_name => %(queue)s, role_name => %(role)s)

-- name: queue_grants
SELECT q.name::text AS queue, g.role_name::text AS role, g.granted_at
FROM pgmb.queue_grant g JOIN pgmb_queue q ON q.id = g.queue_id
ORDER BY q.name, g.role_name

-- name: schema_writers
SELECT w.schema_name::text, w.grantee::text FROM pgmb.schema_writers() w ORDER BY 1, 2

-- name: public_extension_functions
SELECT p.oid::regprocedure::text
FROM pg_extension e
JOIN pg_depend d ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
                AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
JOIN pg_proc p ON p.oid = d.objid,
     aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE e.extname = %(extension)s AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
ORDER BY 1

-- name: unreviewed_public_routines
-- The routines of schema pgmb that PUBLIC may execute besides the reviewed list.
SELECT p.oid::regprocedure::text
FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.pronamespace = 'pgmb'::regnamespace AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
  AND NOT EXISTS (SELECT 1 FROM unnest(%(reviewed)s::text[]) r WHERE to_regprocedure(r) = p.oid)
ORDER BY 1

-- name: group_roles
SELECT g.role_name::text, g.present, g.applied, g.grantable, quote_ident(current_user) AS owner
FROM pgmb.group_roles() g
