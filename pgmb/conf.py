"""pgmb settings: one ``PGMB = {...}`` dict in Django settings, read here with typed defaults.

Use :func:`get` everywhere; never read ``settings.PGMB`` directly.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .archive_age import DEFAULT_OLDER_THAN_DAYS, days_problem

#: The defaults of HOUSEKEEPING_MIN_INDEX_BYTES and HOUSEKEEPING_BLOAT_FACTOR, also those of
#: pgmb.housekeeping.Thresholds (a call that passes no thresholds).
DEFAULT_MIN_INDEX_BYTES = 1024 * 1024
DEFAULT_BLOAT_FACTOR = 4.0
DEFAULT_HISTORY_PREMAKE_DAYS = 3

#: Networks no endpoint may reach unless ENDPOINT_POLICY allows them: link-local, where a
#: cloud's metadata service answers (169.254.169.254).
LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
#: Metadata services outside link-local: AWS's IPv6 one (fd00:ec2::254), Alibaba Cloud's
#: (100.100.100.200).
METADATA = ("fd00:ec2::254/128", "100.100.100.200/32")
#: The IPv4 networks above as IPv6 reaches them through NAT64 (64:ff9b::/96, RFC 6052) and
#: 6to4 (2002::/16, RFC 3056): the address a gateway translates to is the IPv4 one.
TRANSLATED_METADATA = (
    "64:ff9b::a9fe:0/112",
    "64:ff9b::6464:64c8/128",
    "2002:a9fe::/32",
    "2002:6464:64c8::/48",
)
#: The default ENDPOINT_POLICY: workers are the operator's own services (private ranges and
#: loopback stay reachable), link-local and the metadata services are refused, also through
#: NAT64 and 6to4. The in-database path's default is the same list,
#: ``pgmb.default_endpoint_deny()`` (tests/rules/test_endpoint_presets.py).
DEFAULT_ENDPOINT_POLICY: dict[str, list[str]] = {
    "allow": [],
    "deny": [*LINK_LOCAL, *METADATA, *TRANSLATED_METADATA],
}
#: The documented preset for endpoints registered by untrusted users: only public addresses
#: (loopback, link-local, the metadata services, private, unique-local, CGNAT, "this
#: network", and NAT64 and 6to4, which reach any IPv4 address, refused).
#: ``PGMB = {"ENDPOINT_POLICY": pgmb.conf.UNTRUSTED_ENDPOINTS}``.
UNTRUSTED_ENDPOINTS: dict[str, list[str]] = {
    "allow": [],
    "deny": [
        *DEFAULT_ENDPOINT_POLICY["deny"],
        "127.0.0.0/8",
        "::1/128",
        "0.0.0.0/8",
        "::/128",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
    ],
}


@dataclass(frozen=True)
class Settings:
    #: Database alias pgmb uses when a call does not name one.
    DATABASE: str = "default"
    #: Dotted path of the json.JSONEncoder subclass used for bodies and headers.
    JSON_ENCODER: str = "django.core.serializers.json.DjangoJSONEncoder"
    #: Messages per INSERT statement when `pgmb_send --file` publishes in bulk.
    SEND_BATCH_SIZE: int = 1000
    #: External dispatcher (`manage.py pgmb_dispatch`): requests in flight, claim size,
    #: the longest sleep between polls when no notification arrives, and how often it
    #: reclaims leases that ran out (dispatchers that died).
    DISPATCH_CONCURRENCY: int = 64
    DISPATCH_BATCH: int = 100
    DISPATCH_POLL_INTERVAL: float = 1.0
    DISPATCH_RECLAIM_INTERVAL: float = 5.0
    #: Seconds `pgmb_dispatch --until-idle` keeps trying to reach an unreachable database
    #: before it exits with an error (a dispatcher without --until-idle never gives up).
    DISPATCH_GIVE_UP: float = 30.0
    #: Seconds between a dispatcher's heartbeats (pgmb.dispatcher_registry). At most 20: one
    #: without a heartbeat for 60 s is shown as gone (pgmb.dispatcher_registry.GONE_AFTER).
    DISPATCH_HEARTBEAT_INTERVAL: float = 5.0
    #: How much of a failed response's body is kept in the history, in bytes.
    RESPONSE_BODY_LIMIT: int = 500
    #: A bearer token that may read ``/metrics`` (``Authorization: Bearer <token>``); empty:
    #: only logged-in staff users may. At least 16 printable ASCII characters, no blanks.
    METRICS_TOKEN: str = ""
    #: Seconds after which the admin dashboard reloads itself; 0: it does not.
    DASHBOARD_REFRESH: int = 30
    #: Days after which `manage.py pgmb_pipeline archive` archives a finished message when
    #: no --older-than is given (fractions allowed; 0: every finished message).
    PIPELINE_ARCHIVE_OLDER_THAN_DAYS: float = DEFAULT_OLDER_THAN_DAYS
    #: The history's days made ahead, after today (pgmb.history.premake_call; the SQL
    #: default of pgmb.premake_history, which pg_cron's pgmb.maintenance() uses, is the same).
    HISTORY_PREMAKE_DAYS: int = DEFAULT_HISTORY_PREMAKE_DAYS
    #: Days after which `manage.py pgmb_history retire` drops a day of history (its
    #: finished messages and their attempts) when no --older-than is given; None: the
    #: command needs --older-than (history is kept until asked).
    HISTORY_RETENTION_DAYS: float | None = None
    #: Housekeeping of pgmb_delivery's indexes (pgmb.housekeeping): the external
    #: dispatcher looks, once it has drained work, at most once per this many seconds
    #: (0: never; ``manage.py pgmb_housekeeping`` still does). An index is rebuilt when it
    #: is larger than HOUSEKEEPING_MIN_INDEX_BYTES and than HOUSEKEEPING_BLOAT_FACTOR
    #: (more than 1) times what the live rows need.
    HOUSEKEEPING_INTERVAL: float = 3600.0
    HOUSEKEEPING_MIN_INDEX_BYTES: int = DEFAULT_MIN_INDEX_BYTES
    HOUSEKEEPING_BLOAT_FACTOR: float = DEFAULT_BLOAT_FACTOR
    #: The external dispatcher vacuums pgmb_delivery once it has drained its work, if it
    #: claimed at least this many deliveries since its last vacuum (0: never; autovacuum
    #: alone).
    HOUSEKEEPING_VACUUM_EVERY: int = 1_000
    #: The networks endpoints may and may not reach ({"allow": [...], "deny": [...]}, CIDR
    #: texts): an address in an allowed network is reachable, else one in a denied network
    #: is refused, else it is reachable. Checked on the address connected to, on every path
    #: that connects (pgmb.endpoint_policy), and when a worker is saved.
    ENDPOINT_POLICY: dict = field(default_factory=lambda: dict(DEFAULT_ENDPOINT_POLICY))
    #: For a database alias whose connections go through a transaction pooler (PgBouncer),
    #: an alias of the same database that connects to PostgreSQL directly: pgmb's processes
    #: LISTEN there and do housekeeping there ({"default": "direct"}). Without one they poll,
    #: and do no housekeeping through the pooler (pgmb.db.pooler).
    DIRECT_DATABASES: dict = field(default_factory=dict)

    @cached_property
    def json_encoder(self) -> type:
        """The encoder class, imported once (every send uses it)."""
        return import_string(self.JSON_ENCODER)


_ACCEPTS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "float | None": (int, float, type(None)),
    "dict": (dict,),
}
_KINDS: dict[str, str] = {f.name: str(f.type) for f in fields(Settings)}
_TYPES: dict[str, tuple[type, ...]] = {name: _ACCEPTS[kind] for name, kind in _KINDS.items()}
_cache: Settings | None = None
#: The shortest METRICS_TOKEN accepted: a bearer token is a password.
METRICS_TOKEN_MIN_LENGTH = 16

#: A third of the 60 s after which a silent dispatcher is shown as gone
#: (pgmb.dispatcher_registry).
MAX_HEARTBEAT_INTERVAL = 20.0
#: Settings that existed once, and where their job went.
_REMOVED = {
    **dict.fromkeys(
        (
            "DEFAULT_MAX_RETRIES",
            "DEFAULT_BACKOFF_BASE",
            "DEFAULT_BACKOFF_MAX",
            "DEFAULT_LEASE_SECONDS",
            "DEFAULT_TIMEOUT",
        ),
        "defaults of new queues and workers are the columns' defaults (pgmb.models); "
        "set the value on each queue or worker instead",
    ),
    "RATE_BURST": "the token bucket's size is each worker's own 'burst' field",
}


def errors(raw: Any) -> list[str]:
    """Describe what is wrong with a raw ``PGMB`` setting (used by the system checks)."""
    if not isinstance(raw, dict):
        return [f"PGMB must be a dict, not {type(raw).__name__}"]
    problems = []
    for key, value in raw.items():
        if key in _REMOVED:
            problems.append(f"PGMB[{key!r}] is no longer a setting: {_REMOVED[key]}")
        elif key not in _TYPES:
            problems.append(f"PGMB[{key!r}] is not a pgmb setting (known: {', '.join(_TYPES)})")
        elif isinstance(value, bool) or not isinstance(value, _TYPES[key]):
            problems.append(f"PGMB[{key!r}] must be {_KINDS[key]}, got {value!r}")
        elif isinstance(value, (int, float)) and value < 0:
            problems.append(f"PGMB[{key!r}] must not be negative, got {value!r}")
    if not problems and "JSON_ENCODER" in raw:
        try:
            import_string(raw["JSON_ENCODER"])
        except ImportError as exc:
            problems.append(f"PGMB['JSON_ENCODER'] cannot be imported: {exc}")
    for key in ("SEND_BATCH_SIZE", "DISPATCH_CONCURRENCY", "DISPATCH_BATCH"):
        if not problems and raw.get(key, 1) < 1:
            problems.append(f"PGMB[{key!r}] must be at least 1")
    for key in (
        "DISPATCH_POLL_INTERVAL",
        "DISPATCH_RECLAIM_INTERVAL",
        "DISPATCH_GIVE_UP",
        "DISPATCH_HEARTBEAT_INTERVAL",
    ):
        if not problems and raw.get(key, 1) <= 0:
            problems.append(f"PGMB[{key!r}] must be positive")
    if not problems and raw.get("HOUSEKEEPING_BLOAT_FACTOR", DEFAULT_BLOAT_FACTOR) <= 1:
        problems.append(
            "PGMB['HOUSEKEEPING_BLOAT_FACTOR'] must be more than 1 (at most 1, every index "
            "would be rebuilt at every look)"
        )
    days = raw.get("PIPELINE_ARCHIVE_OLDER_THAN_DAYS", DEFAULT_OLDER_THAN_DAYS)
    if not problems and days_problem(days):
        problems.append(f"PGMB['PIPELINE_ARCHIVE_OLDER_THAN_DAYS'] {days_problem(days)}")
    premake = raw.get("HISTORY_PREMAKE_DAYS", DEFAULT_HISTORY_PREMAKE_DAYS)
    if not problems and (
        isinstance(premake, bool) or not isinstance(premake, int) or not 0 <= premake <= 366
    ):
        problems.append("PGMB['HISTORY_PREMAKE_DAYS'] must be a whole number from 0 to 366")
    retention = raw.get("HISTORY_RETENTION_DAYS")
    if not problems and retention is not None and days_problem(retention):
        problems.append(f"PGMB['HISTORY_RETENTION_DAYS'] {days_problem(retention)}")
    token = raw.get("METRICS_TOKEN", "")
    if (
        not problems
        and token
        and not (
            len(token) >= METRICS_TOKEN_MIN_LENGTH
            and token.isascii()
            and token.isprintable()
            and " " not in token
        )
    ):
        problems.append(
            f"PGMB['METRICS_TOKEN'] must be empty (no bearer access) or at least "
            f"{METRICS_TOKEN_MIN_LENGTH} printable ASCII characters without blanks"
        )
    if not problems and "ENDPOINT_POLICY" in raw:
        problems.extend(endpoint_policy_problems(raw["ENDPOINT_POLICY"]))
    if not problems and "DIRECT_DATABASES" in raw:
        problems.extend(direct_databases_problems(raw["DIRECT_DATABASES"]))
    if not problems and raw.get("DISPATCH_HEARTBEAT_INTERVAL", 1) > MAX_HEARTBEAT_INTERVAL:
        problems.append(
            f"PGMB['DISPATCH_HEARTBEAT_INTERVAL'] must be at most {MAX_HEARTBEAT_INTERVAL:g} "
            "seconds (a dispatcher without a heartbeat for 60 s is shown as gone)"
        )
    return problems


def endpoint_policy_problems(policy: dict) -> list[str]:
    """What is wrong with an ENDPOINT_POLICY value."""
    unknown = set(policy) - {"allow", "deny"}
    if unknown:
        return [f"PGMB['ENDPOINT_POLICY'] takes the keys 'allow' and 'deny', not {sorted(unknown)}"]
    problems = []
    for key in ("allow", "deny"):
        networks = policy.get(key, [])
        if not isinstance(networks, (list, tuple)) or not all(isinstance(n, str) for n in networks):
            problems.append(f"PGMB['ENDPOINT_POLICY'][{key!r}] must be a list of CIDR texts")
            continue
        for network in networks:
            try:
                ipaddress.ip_network(network)
            except ValueError as exc:
                problems.append(f"PGMB['ENDPOINT_POLICY'][{key!r}]: {exc}")
    return problems


def direct_databases_problems(mapping: dict) -> list[str]:
    """What is wrong with a DIRECT_DATABASES value: each key and value an alias of
    ``settings.DATABASES``, never the same."""
    known = getattr(django_settings, "DATABASES", {})
    problems = []
    for pooled, direct in mapping.items():
        where = f"PGMB['DIRECT_DATABASES'][{pooled!r}]"
        if not isinstance(pooled, str) or not isinstance(direct, str):
            problems.append(f"{where} must map a database alias to a database alias")
        elif unknown := [alias for alias in (pooled, direct) if alias not in known]:
            problems.append(f"{where}: {unknown[0]!r} is not in settings.DATABASES")
        elif pooled == direct:
            problems.append(f"{where} names the same alias: give one that connects directly")
    return problems


def get() -> Settings:
    """The current pgmb settings (cached; refreshed when Django's settings change)."""
    global _cache
    if _cache is None:
        raw = getattr(django_settings, "PGMB", {})
        problems = errors(raw)
        if problems:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured("; ".join(problems))
        _cache = Settings(**raw)
    return _cache


def _reset(*, setting: str, **_: Any) -> None:
    global _cache
    if setting == "PGMB":
        _cache = None


setting_changed.connect(_reset)
