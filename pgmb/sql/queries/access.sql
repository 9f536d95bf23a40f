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
