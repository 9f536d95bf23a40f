"""The tables of the broker. Django owns them; the SQL in ``pgmb/sql`` works on them.

A message is stored once in ``pgmb_message``; routing adds one ``pgmb_delivery`` per
matching queue. Deliveries are the hot table and hold only live work: once acked a
delivery leaves it (its attempts stay in ``pgmb_attempt``), once dead it moves to
``pgmb_dead_letter``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import re
import uuid
from collections.abc import Callable
from typing import Any

import pgtrigger
from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import endpoint_policy, final_answers, routing, sql
from .errors import PgmbError
from .ids import uuid7
from .trigger_guard import GuardedTrigger
from .worker_secrets import new_secret_problem


def _validate(check: Callable[..., object], *args: Any) -> None:
    """Run a pgmb check and report its failure the way Django forms expect."""
    try:
        check(*args)
    except PgmbError as exc:
        raise ValidationError(str(exc)) from exc


def validate_worker_name(value: str) -> None:
    _validate(routing.validate_name, value, "worker")


def validate_queue_name(value: str) -> None:
    _validate(routing.validate_name, value, "queue")


def validate_binding_key(value: str) -> None:
    _validate(routing.validate_binding_key, value)


def validate_routing_key(value: str) -> None:
    _validate(routing.validate_routing_key, value)


_BLANKS = routing.KEY_FORBIDDEN[1:-1]  # the key rule's blanks and control characters
#: A port from 1 to 65535, written without leading zeros.
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
#: The endpoint rule, the very regex text pgmb.prepare_worker() applies in SQL: "http://" or
#: "https://" (the scheme in any case); optionally a user name and password ending at the
#: last "@" of the authority; a host, either an IPv6 address in brackets (hexadecimal
#: digits, dots and at least one colon) or a name or IPv4 address of at least one
#: character that is none of "/?#@[]:" and no blank or control character
#: (routing.KEY_FORBIDDEN); optionally ":" and a port from 1 to 65535 (an empty port is the
#: scheme's); then optionally a path, query or fragment without blanks or control
#: characters. Single-label hosts such as "http://web:8000/" are fine, unlike with
#: Django's URLValidator; "http://[::1" and "http://a:99999/" are not (urllib cannot
#: split the one, no connection can be made to the other). The scheme is spelled out
#: letter by letter because Python's IGNORECASE would also take U+017F (long s) for "s".
ENDPOINT_PATTERN = (
    rf"^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#\[\]{_BLANKS}]*@)?"
    rf"(?:\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|[^/?#@\[\]:{_BLANKS}]+)(?::{_PORT}?)?"
    rf"(?:[/?#][^{_BLANKS}]*)?$"
)
ENDPOINT_RE = re.compile(ENDPOINT_PATTERN)


def validate_endpoint(value: str) -> None:
    if not isinstance(value, str) or not ENDPOINT_RE.fullmatch(value):
        raise ValidationError(
            _(
                "Enter an http:// or https:// URL without blanks, like http://orders:8000/hook "
                "(a port from 1 to 65535, an IPv6 address in brackets)."
            ),
            code="invalid",
        )


def validate_secret(value: str) -> None:
    """The rule of a new secret, :func:`pgmb.worker_secrets.new_secret_problem`
    (``pgmb.new_secret_problem`` in SQL, which the worker trigger applies to a changed one)."""
    problem = new_secret_problem(value) if isinstance(value, str) else "it must be a text"
    if problem is not None:
        raise ValidationError(
            _("Invalid secret: %(problem)s."), code="invalid", params={"problem": problem}
        )


def timeout_within_lease(timeout: float, lease: float) -> bool:
    """Whether a worker's request timeout ends within a queue's lease: strictly shorter,
    so that a request ends before its delivery can be claimed and posted again. NaN ends
    within nothing. The same rule as ``pgmb.timeout_within_lease()`` in SQL (tests/rules,
    one table of cases), which the worker and queue triggers enforce for every writer."""
    return timeout < lease


def _trigger(
    name: str, body: str | None = None, *, guarded: bool = False, **kwargs: Any
) -> pgtrigger.Trigger:
    """A trigger whose function body is the query ``body`` (default: ``name``) of
    triggers.sql; ``guarded`` for one that runs at every publish (pgtrigger.ignore()
    checked without its cost: GuardedTrigger)."""
    kind = GuardedTrigger if guarded else pgtrigger.Trigger
    return kind(name=name, func=sql.query("triggers.sql", body or name), **kwargs)


def _times_outside(*columns: str) -> str:
    """Whether a row's times break pgmb.valid_time, as a trigger's WHEN (written out with
    its constants: it calls no function)."""
    first, end = "'0001-01-01 00:00:00+00'::timestamptz", "'10000-01-01 00:00:00+00'::timestamptz"
    inside = " AND ".join(f"NEW.{c} >= {first} AND NEW.{c} < {end}" for c in columns)
    return f"NOT ({inside})"


# Defaults of new workers and queues, in one place: each field declares its value both as
# Django's default (forms, unsaved objects) and as the column's DEFAULT (db_default), so
# pgmb.worker(), pgmb.create() and plain INSERTs from any client get the same values.
DEFAULT_RPS = 10
DEFAULT_TIMEOUT = 10.0
DEFAULT_BURST = 0.2
DEFAULT_MAX_RETRIES = 5
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_MAX = 300.0
DEFAULT_LEASE_SECONDS = 60.0
#: SQS's five minutes.
DEFAULT_DEDUP_WINDOW = 300.0
#: The longest lease and backoff of a queue (30 days), the bound pgmb.prepare_queue() and
#: the CHECK pgmb_queue_durations_bounded hold in SQL: beyond what PostgreSQL's intervals
#: can add to a time, one queue's value made every claim or retry fail.
MAX_QUEUE_SECONDS = 30 * 24 * 3600


def validate_finite(value: float) -> None:
    """Refuse NaN and infinities, which compare false with every bound in Python."""
    if not math.isfinite(value):
        raise ValidationError(_("Enter a finite number."), code="invalid")


_QUEUE_SECONDS: list[Callable[[Any], None]] = [
    validate_finite,
    MaxValueValidator(MAX_QUEUE_SECONDS),
]

# The circuit breaker's defaults and bounds (pgmb.check_breaker holds the same in SQL).
DEFAULT_BREAKER_WINDOW = 60.0
DEFAULT_BREAKER_MIN_REQUESTS = 20
DEFAULT_BREAKER_COOLDOWN = 30.0
DEFAULT_BREAKER_COOLDOWN_MAX = 600.0
#: The longest breaker window and cool-down (a day).
MAX_BREAKER_SECONDS = 86400
MAX_BREAKER_COUNT = 1_000_000
#: The breaker's state, written only by the SQL functions (pgmb/sql/schema/breakers.sql).
BREAKER_STATE_FIELDS = frozenset(
    {
        "breaker_state",
        "breaker_since",
        "breaker_until",
        "breaker_reason",
        "breaker_streak",
        "breaker_trips",
        "breaker_probe",
        "breaker_window_at",
        "breaker_requests",
        "breaker_failed",
        "breaker_prev_requests",
        "breaker_prev_failed",
    }
)
BREAKER_STATES = [("closed", _("closed")), ("open", _("open")), ("half_open", _("half-open"))]


def validate_positive(value: float) -> None:
    if not value > 0:  # NaN too
        raise ValidationError(_("Enter a number above 0."), code="min_value")


def validate_dead_statuses(value: object) -> None:
    problem = final_answers.statuses_problem(value, classes=True)
    if problem is not None:
        raise ValidationError(problem, code="invalid")


def validate_retried_statuses(value: object) -> None:
    problem = final_answers.statuses_problem(value, classes=False)
    if problem is not None:
        raise ValidationError(problem, code="invalid")


_BREAKER_SECONDS: list[Callable[[Any], None]] = [
    validate_finite,
    validate_positive,
    MaxValueValidator(MAX_BREAKER_SECONDS),
]


#: The columns of pgmb_worker whose UPDATE runs the worker's rules: all but the token
#: bucket (``tokens``, ``tokens_at``), which every claim writes.
WORKER_RULED_COLUMNS = (
    "id", "name", "endpoint", "rps", "timeout", "burst", "secret", "active", "created_at",
    "breaker_failures", "breaker_rate", "breaker_window", "breaker_min_requests",
    "breaker_cooldown", "breaker_cooldown_max", "breaker_state", "breaker_since",
    "breaker_until", "breaker_reason", "breaker_streak", "breaker_trips", "breaker_probe",
    "breaker_window_at", "breaker_requests", "breaker_failed", "breaker_prev_requests",
    "breaker_prev_failed", "dead_statuses", "retried_statuses", "max_in_flight",
)  # fmt: skip


class Worker(models.Model):
    """An HTTP endpoint that messages are POSTed to, at most ``rps`` requests a second."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=48, unique=True, validators=[validate_worker_name])
    endpoint = models.CharField(max_length=2000, validators=[validate_endpoint])
    rps = models.PositiveIntegerField(
        _("requests per second"),
        default=DEFAULT_RPS,
        db_default=DEFAULT_RPS,
        validators=[MinValueValidator(1)],
    )
    timeout = models.FloatField(
        _("timeout (s)"),
        default=DEFAULT_TIMEOUT,
        db_default=DEFAULT_TIMEOUT,
        validators=[MinValueValidator(0.001)],
    )
    burst = models.FloatField(
        _("burst (s)"),
        default=DEFAULT_BURST,
        db_default=DEFAULT_BURST,
        validators=[MinValueValidator(0.001)],
        help_text=_(
            "How many seconds' worth of requests may go out at once after a quiet spell: "
            "the token bucket behind rps holds rps * burst requests (at least one)."
        ),
    )
    secret = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_secret],
        help_text=_("Signs requests the Standard Webhooks way."),
    )
    active = models.BooleanField(default=True)
    # The token bucket behind `rps`, shared by every dispatcher (consumed in pgmb.claim).
    tokens = models.FloatField(default=0, editable=False)
    tokens_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # The circuit breaker's settings (off unless breaker_failures or breaker_rate is set),
    # checked here and by pgmb.check_breaker (pgmb/sql/schema/breakers.sql).
    breaker_failures = models.PositiveIntegerField(
        _("open after failures in a row"),
        null=True,
        blank=True,
        validators=[MaxValueValidator(MAX_BREAKER_COUNT)],
        help_text=_("Empty or 0: no limit on failures in a row."),
    )
    breaker_rate = models.FloatField(
        _("open at failure rate"),
        null=True,
        blank=True,
        validators=[validate_finite, validate_positive, MaxValueValidator(1)],
        help_text=_(
            "A share of the window's requests, above 0 and at most 1 (0.5: half of them "
            "failed). Empty: no rate limit."
        ),
    )
    breaker_window = models.FloatField(
        _("rate window (s)"),
        default=DEFAULT_BREAKER_WINDOW,
        db_default=DEFAULT_BREAKER_WINDOW,
        validators=_BREAKER_SECONDS,
    )
    breaker_min_requests = models.PositiveIntegerField(
        _("rate from requests"),
        default=DEFAULT_BREAKER_MIN_REQUESTS,
        db_default=DEFAULT_BREAKER_MIN_REQUESTS,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_BREAKER_COUNT)],
        help_text=_("The rate counts once the window holds at least this many requests."),
    )
    breaker_cooldown = models.FloatField(
        _("cool-down (s)"),
        default=DEFAULT_BREAKER_COOLDOWN,
        db_default=DEFAULT_BREAKER_COOLDOWN,
        validators=_BREAKER_SECONDS,
        help_text=_("How long an open breaker holds the worker's deliveries before a probe."),
    )
    breaker_cooldown_max = models.FloatField(
        _("cool-down cap (s)"),
        default=DEFAULT_BREAKER_COOLDOWN_MAX,
        db_default=DEFAULT_BREAKER_COOLDOWN_MAX,
        validators=_BREAKER_SECONDS,
        help_text=_("Each failed probe doubles the cool-down, up to this."),
    )
    # The breaker's state, kept only by the SQL functions (pgmb/sql/schema/breakers.sql).
    breaker_state = models.CharField(
        _("breaker"),
        max_length=9,
        choices=BREAKER_STATES,
        default="closed",
        db_default="closed",
        editable=False,
    )
    breaker_since = models.DateTimeField(null=True, blank=True, editable=False)
    #: Open: the end of the cool-down; half-open: until when the probe may take.
    breaker_until = models.DateTimeField(null=True, blank=True, editable=False)
    breaker_reason = models.TextField(default="", db_default="", editable=False)
    #: Counted failures in a row; openings since the breaker last closed.
    breaker_streak = models.IntegerField(default=0, db_default=0, editable=False)
    breaker_trips = models.IntegerField(default=0, db_default=0, editable=False)
    #: The lease of the probe's claim (half-open).
    breaker_probe = models.UUIDField(null=True, blank=True, editable=False)
    # The rate's two buckets: the current one (since breaker_window_at) and the one before.
    breaker_window_at = models.DateTimeField(null=True, blank=True, editable=False)
    breaker_requests = models.IntegerField(default=0, db_default=0, editable=False)
    breaker_failed = models.IntegerField(default=0, db_default=0, editable=False)
    breaker_prev_requests = models.IntegerField(default=0, db_default=0, editable=False)
    breaker_prev_failed = models.IntegerField(default=0, db_default=0, editable=False)
    # Answers that stop retries (pgmb.final_answers; checked here and by
    # pgmb.check_final_answers, stored normalised). Empty: every failure is retried.
    dead_statuses = ArrayField(
        models.TextField(),
        verbose_name=_("dead-letter at once on"),
        default=list,
        db_default=[],
        blank=True,
        validators=[validate_dead_statuses],
        help_text=_(
            "Statuses (410) or classes (4xx), separated by commas, whose answer dead-letters "
            "a delivery at once instead of retrying it. Empty: every failure is retried."
        ),
    )
    retried_statuses = ArrayField(
        models.TextField(),
        verbose_name=_("retried all the same"),
        default=list,
        db_default=[],
        blank=True,
        validators=[validate_retried_statuses],
        help_text=_(
            "Statuses retried as usual although a class above names them, such as 408, 429."
        ),
    )
    # A cap on requests in flight across every dispatcher and the in-database loop
    # (pgmb.claim counts the worker's unexpired leases; pgmb.prepare_worker refuses < 1).
    max_in_flight = models.IntegerField(
        _("requests in flight at most"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=_(
            "How many requests this worker may have in flight at once, across every "
            "dispatcher. Empty: no cap."
        ),
    )

    class Meta:
        db_table = "pgmb_worker"
        ordering = ["name"]
        # Pausing is not "change": the admin's pause and resume actions are granted this.
        permissions = [
            ("pause_worker", "Can pause and resume workers"),
            ("test_worker", "Can send a test request to workers"),
        ]
        triggers = [
            _trigger("worker_validate", when=pgtrigger.Before, operation=pgtrigger.Insert),
            # The same rules for an UPDATE of any column but the token bucket's: every
            # claim refills it (pgmb.claim), and the rules (or even a WHEN to skip them)
            # would cost each claim more than the rest of its worker's part.
            # tests/sql/test_delivery.py checks that every other column is listed.
            _trigger(
                "worker_validate_update",
                "worker_validate",
                when=pgtrigger.Before,
                operation=pgtrigger.UpdateOf(*WORKER_RULED_COLUMNS),
            ),
            # Rotation for every writer (admin, ORM, SQL): a replaced secret keeps signing
            # until it expires (WorkerSecret). Only an UPDATE that changes the secret gets
            # here, never a claim's update of the token bucket.
            _trigger(
                "worker_retire_secret",
                when=pgtrigger.After,
                operation=pgtrigger.UpdateOf("secret"),
                condition=pgtrigger.Condition("OLD.secret IS DISTINCT FROM NEW.secret"),
            ),
            # Only a changed timeout: the claim's token updates never pay for the look-up
            # of the worker's queues (a new worker has none).
            _trigger(
                "worker_timeout",
                when=pgtrigger.Before,
                operation=pgtrigger.UpdateOf("timeout"),
                condition=pgtrigger.Condition("OLD.timeout IS DISTINCT FROM NEW.timeout"),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The breaker's state is kept by the SQL functions: a save of a worker read earlier
        # (the admin's form) would write back the state it read, undoing a transition made
        # meanwhile. Only a new worker's row is written whole.
        if not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name not in BREAKER_STATE_FIELDS
            ]
        super().save(*args, **kwargs)

    def clean(self) -> None:
        super().clean()
        self._clean_endpoint_and_timeout()
        self._clean_final_answers()
        cooldown, cap = self.breaker_cooldown, self.breaker_cooldown_max
        # A value that is not a finite number has its own error already.
        if (
            isinstance(cooldown, float | int)
            and isinstance(cap, float | int)
            and math.isfinite(cooldown)
            and math.isfinite(cap)
            and cap < cooldown
        ):
            raise ValidationError(
                {"breaker_cooldown_max": _("The cap must be at least the cool-down.")}
            )

    def _clean_final_answers(self) -> None:
        """Both lists stored normalised; a status in both is refused (the field validators
        have refused what is not a status)."""
        dead, retried = self.dead_statuses, self.retried_statuses
        if final_answers.statuses_problem(dead, classes=True) is not None:
            return
        if final_answers.statuses_problem(retried, classes=False) is not None:
            return
        self.dead_statuses = final_answers.normalised(dead)
        self.retried_statuses = final_answers.normalised(retried)
        twice = final_answers.in_both(dead, retried)
        if twice is not None:
            raise ValidationError(
                {"retried_statuses": _("%(status)s is in dead_statuses too.") % {"status": twice}},
                code="invalid",
            )

    def _clean_endpoint_and_timeout(self) -> None:
        """The endpoint reaches no address PGMB["ENDPOINT_POLICY"] refuses, and a request
        ends before the lease of any queue it delivers for: a request that outlasts its
        lease lets the delivery be claimed and posted again while it still runs."""
        if isinstance(self.endpoint, str) and ENDPOINT_RE.fullmatch(self.endpoint):
            problem = endpoint_policy.endpoint_problem(self.endpoint)
            if problem is not None:
                raise ValidationError({"endpoint": problem}, code="refused")
        if self._state.adding or not isinstance(self.timeout, float | int):
            return
        lease = (
            Queue.objects.filter(worker_id=self.pk)
            .aggregate(lease=models.Min("lease_seconds"))
            .get("lease")
        )
        if lease is not None and not timeout_within_lease(self.timeout, lease):
            raise ValidationError(
                {
                    "timeout": _(
                        "The timeout must be shorter than the lease of every queue this "
                        "worker delivers for (the shortest is %(lease)s s): a request that "
                        "outlasts its lease is posted twice."
                    )
                    % {"lease": f"{lease:g}"}
                },
                code="max_value",
            )

    @property
    def breaker_on(self) -> bool:
        """Whether the circuit breaker watches this worker (a limit is set)."""
        return bool(self.breaker_failures) or self.breaker_rate is not None


#: The longest a retiring secret may keep signing, counted from its retirement: the CHECK
#: pgmb_worker_secret_expiry_bounded. (The default overlap is pgmb.secret_overlap() in SQL.)
MAX_SECRET_OVERLAP = datetime.timedelta(days=30)


class WorkerSecret(models.Model):
    """A worker's former secret, which still signs its requests until ``expires_at``.

    Rotation (docs/delivery.md): while it lasts, each request carries one signature per
    secret, so a receiver that still holds the old secret and one that has the new both
    verify it. The rows are written by the worker trigger (pgmb.retire_secret) when any
    writer replaces a worker's secret; which secrets sign is pgmb.signing_secrets().
    """

    id = models.BigAutoField(primary_key=True)
    # The foreign key itself is declared in SQL (tables.sql), ON DELETE CASCADE, so that
    # deleting a worker in plain SQL takes its retiring secrets along.
    worker = models.ForeignKey(
        Worker,
        on_delete=models.CASCADE,
        related_name="retiring_secrets",
        db_constraint=False,
    )
    # Never rendered (docs/decisions/0028-secrets-stay-secret-in-the-admin.md).
    secret = models.CharField(max_length=200, editable=False)
    retired_at = models.DateTimeField(
        _("retired"), default=timezone.now, db_default=Now(), editable=False
    )
    expires_at = models.DateTimeField(
        _("signs until"),
        help_text=_(
            "After this it no longer signs. At most 30 days after it was retired; "
            "a time in the past ends it now."
        ),
    )

    class Meta:
        db_table = "pgmb_worker_secret"
        ordering = ["-retired_at", "-id"]
        verbose_name = _("retiring secret")
        constraints = [
            models.UniqueConstraint(fields=["worker", "secret"], name="pgmb_worker_secret_unique"),
            models.CheckConstraint(
                condition=models.Q(expires_at__lte=models.F("retired_at") + MAX_SECRET_OVERLAP),
                name="pgmb_worker_secret_expiry_bounded",
                violation_error_message=_(
                    "A retiring secret may sign for at most 30 days after it was retired."
                ),
            ),
        ]

    def __str__(self) -> str:
        # Never the secret.
        return f"retiring secret #{self.pk}"


class Queue(models.Model):
    """A queue bound to a topic pattern; its messages go to one worker, or, without a
    worker, wait for clients to read them (a pull queue, :mod:`pgmb.pull`)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=48, unique=True, validators=[validate_queue_name])
    binding_key = models.CharField(
        max_length=routing.MAX_KEY_LENGTH,
        validators=[validate_binding_key],
        help_text=_("Topic pattern: words separated by dots; * is one word, # is any number."),
    )
    pattern = models.TextField(editable=False, help_text=_("Compiled from the binding key."))
    #: None: a pull queue, read by clients (pgmb.read, ``manage.py pgmb_consume``).
    worker = models.ForeignKey(
        Worker,
        on_delete=models.PROTECT,
        related_name="queues",
        null=True,
        blank=True,
        help_text=_("Leave empty for a pull queue, read by clients instead of posted to a worker."),
    )
    max_retries = models.PositiveIntegerField(
        default=DEFAULT_MAX_RETRIES, db_default=DEFAULT_MAX_RETRIES
    )
    backoff_base = models.FloatField(
        _("backoff base (s)"),
        default=DEFAULT_BACKOFF_BASE,
        db_default=DEFAULT_BACKOFF_BASE,
        validators=[MinValueValidator(0), *_QUEUE_SECONDS],
    )
    backoff_max = models.FloatField(
        _("backoff cap (s)"),
        default=DEFAULT_BACKOFF_MAX,
        db_default=DEFAULT_BACKOFF_MAX,
        validators=[MinValueValidator(0), *_QUEUE_SECONDS],
    )
    lease_seconds = models.FloatField(
        _("lease (s)"),
        default=DEFAULT_LEASE_SECONDS,
        db_default=DEFAULT_LEASE_SECONDS,
        validators=[MinValueValidator(0.001), *_QUEUE_SECONDS],
    )
    paused = models.BooleanField(default=False)
    #: Seconds in which a message with the dedup id of an earlier one is dropped
    #: (docs/ordering.md); 0 turns de-duplication off for this queue.
    dedup_window = models.FloatField(
        _("de-duplication window (s)"),
        default=DEFAULT_DEDUP_WINDOW,
        db_default=DEFAULT_DEDUP_WINDOW,
        validators=[MinValueValidator(0), *_QUEUE_SECONDS],
    )
    #: Whether a pull queue's acknowledged messages (pgmb.delete, pgmb.pop) leave an 'ack'
    #: row in the history. Off, a delete only deletes, as PGMQ's does: the history, and
    #: what is counted from it (delivered counts, latency, the archive), misses them
    #: (docs/decisions/0063-pull-queues-without-history.md). Push queues always keep it.
    keep_history = models.BooleanField(
        default=True,
        db_default=True,
        help_text=_(
            "Pull queues only. Off: a deleted (acknowledged) message leaves no history row, "
            "so delivered counts and latency do not count it; archived, retried and "
            "dead-lettered messages are still recorded."
        ),
    )
    #: Seconds after its publication that a message's delivery on this queue expires if it
    #: has not been posted (read, for a pull queue) by then; None: never. A message's own
    #: expiry applies too, the earlier of the two (docs/delivery.md, Expiry).
    message_ttl = models.FloatField(
        _("message TTL (s)"),
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001), *_QUEUE_SECONDS],
        help_text=_("Messages not delivered this many seconds after publication expire."),
    )
    #: What becomes of an expired delivery: a dead letter (its last error says so), or
    #: nothing (dropped; its history row stays).
    on_expiry = models.CharField(
        _("on expiry"),
        max_length=16,
        choices=[("dead_letter", _("dead-letter")), ("drop", _("drop"))],
        default="dead_letter",
        db_default="dead_letter",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "pgmb_queue"
        ordering = ["name"]
        # Pausing is not "change": the admin's pause and resume actions are granted this.
        permissions = [
            ("pause_queue", "Can pause and resume queues"),
            ("backfill_queue", "Can backfill queues with stored messages"),
            ("recover_queue", "Can recover the dead letters of queues"),
        ]
        triggers = [
            _trigger(
                "queue_prepare",
                when=pgtrigger.Before,
                operation=pgtrigger.Insert | pgtrigger.Update,
            ),
            _trigger(
                "queue_views",
                when=pgtrigger.After,
                operation=pgtrigger.Insert | pgtrigger.Update | pgtrigger.Delete,
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.binding_key:
            # A bad key is reported by the field's validator; here it only leaves no pattern.
            with contextlib.suppress(PgmbError):
                self.pattern = routing.compile_binding(self.binding_key)
        if self.name:
            base = routing.view_base(self.name)
            clash = (
                Queue.objects.exclude(pk=self.pk)
                .filter(name__in=[base, f"{base}_queue"])
                .exclude(name=self.name)
                .first()
            )
            if clash is not None:
                raise ValidationError(
                    {
                        "name": _(
                            "%(name)s clashes with queue %(other)s: "
                            "both would own the view pgmb.%(view)s."
                        )
                        % {"name": self.name, "other": clash.name, "view": f"{base}_queue"}
                    }
                )
        if (
            self.backoff_base is not None
            and self.backoff_max is not None
            and self.backoff_max < self.backoff_base
        ):
            raise ValidationError({"backoff_max": _("The cap must not be below the base.")})
        if self.worker_id is not None:
            # A queue with a worker keeps its history (the constraint
            # pgmb_queue_history_pull_only, for every writer). A form cannot tell an
            # unchecked box from one it was not sent: the admin's forms keep it on.
            self.keep_history = True
        self._clean_lease()

    def _clean_lease(self) -> None:
        """The lease outlasts the worker's timeout (:func:`timeout_within_lease`), as
        pgmb.prepare_queue() checks for every writer."""
        if self.worker_id is None or not isinstance(self.lease_seconds, float | int):
            return
        worker = Worker.objects.filter(pk=self.worker_id).values("name", "timeout").first()
        if worker is not None and not timeout_within_lease(worker["timeout"], self.lease_seconds):
            raise ValidationError(
                {
                    "lease_seconds": _(
                        "The lease must be longer than the timeout of worker %(worker)s "
                        "(%(timeout)s s): a request that outlasts its lease is posted twice."
                    )
                    % {"worker": worker["name"], "timeout": f"{worker['timeout']:g}"}
                },
                code="min_value",
            )

    @property
    def view_names(self) -> tuple[str, str]:
        """Names of this queue's SQL views in schema ``pgmb`` (queue, dead-letter queue)."""
        return routing.queue_view_names(self.name)


class Message(models.Model):
    """A published message; routed to deliveries by a statement-level trigger."""

    # Time-ordered (pgmb.ids): the key index grows at its right edge.
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    routing_key = models.CharField(
        max_length=routing.MAX_KEY_LENGTH, validators=[validate_routing_key]
    )
    body = models.JSONField()
    headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    available_at = models.DateTimeField(
        help_text=_("Not delivered before this time (delayed messages).")
    )
    # The message options (docs/ordering.md); NULL (or 0) for a message without them, which
    # the triggers' WHEN clauses let through untouched.
    priority = models.SmallIntegerField(
        default=0, db_default=0, help_text=_("Lower is delivered first.")
    )
    # NULL, not "": the triggers' WHEN clauses and partial indexes test IS NOT NULL.
    group_key = models.CharField(  # noqa: DJ001
        _("group"),
        max_length=128,
        null=True,
        blank=True,
        help_text=_("Messages of one group are delivered one at a time, in publish order."),
    )
    depends_on = ArrayField(
        models.UUIDField(),
        null=True,
        blank=True,
        help_text=_("Messages that must be settled before this one is delivered."),
    )
    dedup_id = models.CharField(  # noqa: DJ001
        _("de-duplication id"), max_length=128, null=True, blank=True
    )
    #: Used by failures instead of the queue's max_retries and backoff when set.
    max_retries = models.IntegerField(null=True, blank=True)
    retry_delay = models.FloatField(_("retry delay (s)"), null=True, blank=True)
    #: Not delivered after this time (its TTL, or a time its producer gave); None: never.
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
    #: While a delivery with this key is live on a queue, another message with it is
    #: skipped there or replaces it (``on_duplicate``; docs/publishing.md, Unique while live).
    unique_key = models.CharField(  # noqa: DJ001
        _("unique key"), max_length=128, null=True, blank=True
    )
    on_duplicate = models.CharField(  # noqa: DJ001
        _("on duplicate"),
        max_length=7,
        null=True,
        blank=True,
        choices=[("skip", _("skip")), ("replace", _("replace"))],
    )

    class Meta:
        db_table = "pgmb_message"
        ordering = ["-created_at"]
        indexes = [
            # The admin's list, newest first, and its search by routing-key prefix; the
            # dashboard's last hour (docs/decisions/0017-admin-lists-read-through-indexes.md).
            models.Index(fields=["created_at", "id"], name="pgmb_message_created"),
            models.Index(
                fields=["routing_key"],
                name="pgmb_message_routing_key",
                opclasses=["varchar_pattern_ops"],
            ),
        ]
        # Replaying re-sends to live endpoints: granted by this, not by "change".
        permissions = [
            ("replay_message", "Can replay messages to the queues that acknowledged them")
        ]
        triggers = [
            # Once per publishing statement: guarded (pgmb/trigger_guard.py, decision 0073).
            _trigger(
                "route_messages",
                guarded=True,
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                referencing=pgtrigger.Referencing(new="new_messages"),
            ),
            _trigger(
                "admit_message",
                when=pgtrigger.Before,
                operation=pgtrigger.Insert,
                # Every option column: the option rules run here (pgmb/sql/schema/publish.sql);
                # and the times (docs/decisions/0053): one WHEN of an existing trigger costs
                # a publish less than a trigger of their own.
                condition=pgtrigger.Condition(
                    "NEW.group_key IS NOT NULL OR NEW.depends_on IS NOT NULL"
                    " OR NEW.dedup_id IS NOT NULL OR NEW.max_retries IS NOT NULL"
                    " OR NEW.retry_delay IS NOT NULL"
                    # A unique key's rule and its live deliveries (pgmb.admit_unique).
                    " OR NEW.unique_key IS NOT NULL OR NEW.on_duplicate IS NOT NULL OR "
                    # A NULL expires_at (no expiry) leaves the test NULL: not fired for it.
                    + _times_outside("created_at", "available_at", "expires_at")
                ),
            ),
            _trigger(
                "check_routing_key_update",
                when=pgtrigger.Before,
                operation=pgtrigger.UpdateOf("routing_key"),
                # Inserted keys are checked by route_messages, once per statement (0029).
                condition=pgtrigger.Condition("NOT pgmb.valid_routing_key(NEW.routing_key)"),
            ),
            # Bodies and headers: inserted ones are checked by route_messages, changed ones
            # here (the limits and reserved names of pgmb.message_problem).
            _trigger(
                "check_message_update",
                when=pgtrigger.Before,
                operation=pgtrigger.UpdateOf("body", "headers"),
                condition=pgtrigger.Condition("NOT pgmb.acceptable_message(NEW.body, NEW.headers)"),
            ),
            # Times pgmb.valid_time rejects, changed by any writer (inserted ones: admit_message).
            _trigger(
                "check_message_times",
                when=pgtrigger.Before,
                operation=pgtrigger.UpdateOf("created_at", "available_at", "expires_at"),
                condition=pgtrigger.Condition(
                    _times_outside("created_at", "available_at", "expires_at")
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.routing_key} {self.id}"


class Delivery(models.Model):
    """A live delivery of a message to a queue: ready, delayed or leased.

    ``available_at`` is when it may next be claimed. A claim moves it to the lease's end,
    so a lease that runs out makes the delivery claimable again with no extra step.
    """

    class State(models.TextChoices):
        READY = "ready", _("ready")
        LEASED = "leased", _("leased")
        #: Behind an earlier member of its group, or its dependencies are not settled.
        WAITING = "waiting", _("waiting")

    id = models.BigAutoField(primary_key=True)
    # No database FK to the message: the routing trigger creates deliveries only from rows
    # it has just inserted, and a per-row RI check would slow every publish.
    # Both FKs are covered by the composite indexes below; their own indexes would only
    # slow publishing.
    message = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="deliveries",
    )
    # No database FK to the queue either: its RI check and row lock cost every publish
    # (docs/benchmarks.md). Django cascades ORM deletes; the queue's trigger, SQL ones.
    queue = models.ForeignKey(
        Queue,
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,
        related_name="deliveries",
    )
    state = models.CharField(max_length=8, choices=State.choices, default=State.READY)
    attempts = models.PositiveIntegerField(default=0)
    available_at = models.DateTimeField()
    lease_id = models.UUIDField(null=True, blank=True, editable=False)
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    #: Whether the current lease's request has started (``pgmb.start``): an expiry of the
    #: lease then counts as an attempt; before, it hands the claim's attempt back. Read
    #: only while leased (each claim clears it).
    started = models.BooleanField(default=False, db_default=False, editable=False)
    #: Leases of this delivery that expired before their request was marked started, and
    #: were not counted: at most 2, later ones count (pgmb/sql/schema/deliveries.sql).
    unsent_leases = models.SmallIntegerField(default=0, db_default=0, editable=False)
    # The message's options that claims and waiting need, copied by the routing trigger.
    priority = models.SmallIntegerField(default=0, db_default=0, editable=False)
    group_key = models.CharField(  # noqa: DJ001
        _("group"), max_length=128, null=True, blank=True, editable=False
    )
    depends_on = ArrayField(models.UUIDField(), null=True, blank=True, editable=False)
    #: Some waiting delivery depends on this one's message: its removal releases them.
    dependents = models.BooleanField(default=False, db_default=False, editable=False)
    #: Not posted (nor read) after this: the earlier of its message's expiry and its queue's
    #: message_ttl after publication, set by the routing trigger; None: never (pgmb.expire).
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: When it was cancelled while leased (``pgmb.cancel``): the outcome of its request in
    #: flight is recorded as 'canceled' and deletes it, never retried nor dead-lettered.
    canceled_at = models.DateTimeField(_("cancelled at"), null=True, blank=True, editable=False)
    #: Its message's unique key, copied by the routing trigger: one live delivery per key
    #: and queue (pgmb_delivery_unique_key). Requeues, replays and backfills make none.
    unique_key = models.CharField(  # noqa: DJ001
        _("unique key"), max_length=128, null=True, blank=True, editable=False
    )

    class Meta:
        db_table = "pgmb_delivery"
        verbose_name_plural = "deliveries"
        # Ending or hastening a delivery is not "change" (rows move only through the state
        # machine): the admin's actions and the pgmb_deliveries command's operators are
        # granted these (docs/decisions/0084-cancel-and-run-now.md).
        permissions = [
            ("cancel_delivery", "Can cancel deliveries"),
            ("run_delivery", "Can make deliveries due now"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["message", "queue"], name="pgmb_delivery_message_queue"
            ),
            # Partial: a delivery without a key has no entry, so costs no probe.
            models.UniqueConstraint(
                fields=["queue", "unique_key"],
                name="pgmb_delivery_unique_key",
                condition=models.Q(unique_key__isnull=False),
            ),
        ]
        # Claims scan only ready rows; leased rows come back through pgmb.reclaim_expired().
        indexes = [
            # `id` breaks ties in FIFO order: one INSERT gives all its rows the same time.
            # What pgmb.metrics_all() counts rides along (pgmb/sql/schema/metrics.sql): a queue's
            # figures are an index-only scan of its entries.
            models.Index(
                fields=["queue", "priority", "available_at", "id"],
                name="pgmb_delivery_due",
                condition=models.Q(state="ready"),
                include=["attempts", "created_at"],
            ),
            models.Index(
                fields=["available_at"],
                name="pgmb_delivery_leased",
                condition=models.Q(state="leased"),
            ),
        ]
        # Waiting (pgmb/sql/schema/publish.sql): a group's or a message's settlement releases the
        # deliveries behind it. Rows without a group or dependents never fire these.
        triggers = [
            # Unique while live (pgmb.admit_unique_delivery). Its name sorts before
            # hold_delivery's, so a delivery it leaves out never waits or locks its group.
            _trigger(
                "admit_unique_key",
                when=pgtrigger.Before,
                operation=pgtrigger.Insert,
                condition=pgtrigger.Condition("NEW.unique_key IS NOT NULL"),
            ),
            _trigger(
                "hold_delivery",
                when=pgtrigger.Before,
                operation=pgtrigger.Insert,
                condition=pgtrigger.Condition(
                    "NEW.group_key IS NOT NULL OR NEW.depends_on IS NOT NULL"
                ),
            ),
            _trigger(
                "release_after_delivery",
                when=pgtrigger.After,
                operation=pgtrigger.Delete,
                condition=pgtrigger.Condition("OLD.group_key IS NOT NULL OR OLD.dependents"),
            ),
            # Times pgmb.valid_time rejects, changed by any writer. Deliveries are inserted by
            # pgmb from messages whose times were checked (routing, requeue, replay).
            _trigger(
                "check_delivery_times",
                when=pgtrigger.Before,
                operation=pgtrigger.UpdateOf("created_at", "available_at"),
                condition=pgtrigger.Condition(_times_outside("created_at", "available_at")),
            ),
        ]

    def __str__(self) -> str:
        # The queue by name: the title of the delivery's page in the admin.
        return f"{self.message_id} → {self.queue.name}"


class DeadLetter(models.Model):
    """A delivery that used up its attempts; an operator can requeue it."""

    id = models.BigAutoField(primary_key=True)
    message = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="dead_letters",
    )
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="dead_letters")
    attempts = models.PositiveIntegerField()
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(_("dead since"))

    class Meta:
        db_table = "pgmb_dead_letter"
        # Moving dead letters is not "change" (rows move only through the state machine):
        # the admin's actions and pgmb_requeue's operators are granted these.
        permissions = [
            ("requeue_deadletter", "Can requeue dead letters"),
            ("purge_deadletter", "Can purge dead letters"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["message", "queue"], name="pgmb_dead_letter_message_queue"
            )
        ]
        # The admin's list, newest first.
        indexes = [models.Index(fields=["created_at", "id"], name="pgmb_dead_letter_created")]
        # A dead letter of a dependency holds its dependents until requeued and settled, or
        # purged (pgmb/sql/schema/publish.sql).
        triggers = [
            _trigger("release_after_dead_letter", when=pgtrigger.After, operation=pgtrigger.Delete)
        ]

    def __str__(self) -> str:
        # The queue by name: the title of the dead letter's page in the admin.
        return f"{self.message_id} ✗ {self.queue.name}"


class Attempt(models.Model):
    """Append-only history: one row per delivery attempt and its outcome."""

    class Outcome(models.TextChoices):
        ACK = "ack", _("acknowledged")
        RETRY = "retry", _("will retry")
        DEAD = "dead", _("dead-lettered")
        EXPIRED = "expired", _("lease expired")
        #: A lease that expired before its request started: no request, no attempt spent.
        UNSENT = "unsent", _("lease expired unsent")
        #: A delivery whose time to live ran out before it was posted (pgmb.expire): no
        #: request was made. Not "expired", which is a lease's.
        TTL = "ttl", _("expired (TTL)")
        #: A pull queue's message settled by pgmb.archive: consumed, not acknowledged.
        ARCHIVED = "archived", _("archived")
        #: Ended by pgmb.cancel: removed, or its request's outcome while in flight. Spelled
        #: to fit the column's 8 characters (docs/decisions/0084-cancel-and-run-now.md).
        CANCELED = "canceled", _("cancelled")

    id = models.BigAutoField(primary_key=True)
    message = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="attempts",
    )
    queue = models.ForeignKey(
        Queue,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="attempts",
    )
    attempt = models.PositiveIntegerField()
    outcome = models.CharField(max_length=8, choices=Outcome.choices)
    status_code = models.IntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "pgmb_attempt"
        indexes = [
            models.Index(fields=["message", "queue"], name="pgmb_attempt_message_queue"),
            models.Index(fields=["created_at"], name="pgmb_attempt_created"),
            # Acknowledged attempts per queue: pgmb.metrics' total_messages and a worker's
            # last success.
            models.Index(
                fields=["queue", "created_at"],
                name="pgmb_attempt_acked",
                condition=models.Q(outcome="ack"),
            ),
            # Its counterpart: with it every attempt is in one of the two by queue (the
            # admin's queue and worker filters), and failures alone are a small index that
            # the status filter reads (pgmb/sql/schema/tables.sql adds joint statistics of
            # outcome and status_code).
            models.Index(
                fields=["queue", "created_at", "status_code"],
                name="pgmb_attempt_failed",
                condition=~models.Q(outcome="ack"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} #{self.attempt} {self.outcome}"


class DispatcherProcess(models.Model):
    """A dispatcher that registered itself: running, gone (no heartbeat for a while) or
    stopped. Rows are written only through ``pgmb.dispatcher_start``, ``_beat`` and
    ``_stop`` (the view ``pgmb.dispatchers``); its state comes from ``pgmb.dispatcher_state``."""

    class Kind(models.TextChoices):
        EXTERNAL = "external", _("external (pgmb_dispatch)")
        IN_DATABASE = "in_database", _("in the database (dispatch_loop)")
        CONSUMER = "consumer", _("pull consumer (pgmb_consume)")

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    #: The machine of an external dispatcher; the server's address for the in-database loop.
    host = models.CharField(max_length=255, blank=True, default="", db_default="")
    #: The process id; for the in-database loop, its backend's (pg_backend_pid()).
    pid = models.IntegerField(_("pid"))
    #: The queues it dispatches; NULL: all of them.
    queues = ArrayField(models.TextField(), null=True, blank=True)
    started_at = models.DateTimeField(_("started"), db_default=Now())
    heartbeat_at = models.DateTimeField(_("last heartbeat"), db_default=Now())
    #: NULL while it runs (or until it is found gone).
    stopped_at = models.DateTimeField(_("stopped"), null=True, blank=True)
    #: Counters as of the last heartbeat (delivered and failed since it started).
    in_flight = models.IntegerField(_("in flight"), default=0, db_default=0)
    delivered = models.BigIntegerField(default=0, db_default=0)
    failed = models.BigIntegerField(default=0, db_default=0)
    #: It found nothing to claim and waits for a NOTIFY: publishers send one only then
    #: (``pgmb.wake_dispatchers``). NULL until its first claim: such a dispatcher is woken
    #: by every publisher.
    waiting = models.BooleanField(null=True, blank=True, default=None)

    class Meta:
        db_table = "pgmb_dispatcher"
        verbose_name = _("dispatcher")
        ordering = ["-started_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind="external")
                | models.Q(kind="in_database")
                | models.Q(kind="consumer"),
                name="pgmb_dispatcher_kind",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.host} {self.pid}"


class Dashboard(models.Model):
    """Not a table: the operator's dashboard (:mod:`pgmb.admin.dashboard`) as an entry of
    the admin index, which lists models only. Nothing reads or writes it."""

    class Meta:
        managed = False
        db_table = "pgmb_dashboard"  # never created
        verbose_name = _("dashboard")
        verbose_name_plural = _("Dashboard")
        # No rows to add, change, delete or view; seeing the page (and /metrics) is granted
        # by this permission, not by being staff (docs/decisions/0029-console-permission.md).
        default_permissions = ()
        permissions = [("view_dashboard", "Can view the dashboard and the metrics")]

    def __str__(self) -> str:
        return str(self._meta.verbose_name)


class HourlyStatistics(models.Model):
    """Delivery figures of one UTC hour, computed from the attempt history by the Spark
    pipeline's ``stats`` job (:mod:`pgmb.pipeline.stats`) and read with :mod:`pgmb.hourly_stats`.

    A row is one queue (with its worker), one worker over all its queues (``queue_name``
    empty), or every queue (both names empty). Names, not foreign keys: the figures outlive
    the queues and workers they count, and the attempts that the archive moves away.
    """

    id = models.BigAutoField(primary_key=True)
    #: The hour's start, a whole UTC hour.
    hour = models.DateTimeField()
    #: Empty: all the queues of ``worker_name`` (or of every worker).
    queue_name = models.CharField(max_length=48, blank=True)
    #: Empty (with ``queue_name``): every worker.
    worker_name = models.CharField(max_length=48, blank=True)
    attempts = models.BigIntegerField()
    #: Acknowledged attempts.
    delivered = models.BigIntegerField()
    #: Attempts that were not acknowledged (retried, dead-lettered or expired).
    failed = models.BigIntegerField()
    retried = models.BigIntegerField()
    dead_lettered = models.BigIntegerField(_("dead-lettered"))
    #: Leases that ran out without an answer.
    expired = models.BigIntegerField()
    #: The average attempt number of the acknowledged attempts (1.0: none needed a retry).
    attempts_per_message = models.FloatField(null=True, blank=True)
    #: From publishing (the message's created_at) to acknowledgement, over the acks.
    latency_p50_ms = models.FloatField(_("latency p50 (ms)"), null=True, blank=True)
    latency_p95_ms = models.FloatField(_("latency p95 (ms)"), null=True, blank=True)
    latency_p99_ms = models.FloatField(_("latency p99 (ms)"), null=True, blank=True)
    #: The three most frequent statuses of failed attempts, [{"status": 503, "count": 7}, …];
    #: status null: no answer (connection error, timeout, lease expired).
    top_errors = models.JSONField(default=list, blank=True)

    class Meta:
        db_table = "pgmb_statistics"
        verbose_name = _("hourly statistics")
        verbose_name_plural = _("hourly statistics")
        ordering = ["-hour", "worker_name", "queue_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "queue_name", "worker_name"],
                name="pgmb_statistics_hour_queue_worker",
            )
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} {self.worker_name or '*'}/{self.queue_name or '*'}"


class ArchiveRun(models.Model):
    """One run of the pipeline's ``archive`` job (:mod:`pgmb.pipeline.archive`).

    Written only by the job, which moves a run from ``claiming`` (taking its days, choosing
    its messages) through ``writing`` (their Parquet) and ``written`` (the Parquet committed
    under ``output``; dropping its days and deleting its rows may begin) to ``done``. A run
    that stopped before ``written`` is ``discarded`` by the next one (its files removed, its
    messages freed, its days handed to the next run); one that stopped after it is finished
    by the next one (drops and deletes only).
    """

    class State(models.TextChoices):
        CLAIMING = "claiming", _("choosing messages")
        WRITING = "writing", _("writing Parquet")
        WRITTEN = "written", _("written, deleting")
        DONE = "done", _("done")
        DISCARDED = "discarded", _("discarded")

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(
        max_length=10, choices=State.choices, default=State.CLAIMING, db_default="claiming"
    )
    #: The archive's root (a fully qualified Hadoop URI such as file:/data/pgmb-archive).
    output = models.TextField()
    #: Messages finished before this time (the database's clock) are archived.
    cutoff = models.DateTimeField()
    started_at = models.DateTimeField(_("started"), db_default=Now())
    written_at = models.DateTimeField(_("Parquet committed"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    messages = models.BigIntegerField(default=0, db_default=0)
    attempts = models.BigIntegerField(default=0, db_default=0)
    #: Parquet files and their bytes, as committed.
    files = models.BigIntegerField(default=0, db_default=0)
    bytes = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = "pgmb_archive_run"
        verbose_name = _("archive run")
        ordering = ["-id"]
        # OR-ed equalities rather than IN: a dump of IN (…) on varchar reloads with other
        # casts, and the catalog must match the migrations' (tests/migrations/test_schema.py).
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state="claiming")
                | models.Q(state="writing")
                | models.Q(state="written")
                | models.Q(state="done")
                | models.Q(state="discarded"),
                name="pgmb_archive_run_state",
            )
        ]

    def __str__(self) -> str:
        return f"archive run {self.id} ({self.state})"


class ArchiveItem(models.Model):
    """A message claimed by an archive run that has not left the database yet.

    The unique message keeps a message in one run at a time, and ``pgmb.replay`` skips
    claimed messages. Rows leave with their message, in the same short transaction.
    """

    id = models.BigAutoField(primary_key=True)
    # Covered by the (run, id) index below, the order in which runs read and delete.
    run = models.ForeignKey(
        ArchiveRun, on_delete=models.CASCADE, db_index=False, related_name="items"
    )
    # No database FK, as for deliveries: the item leaves with its message.
    message = models.OneToOneField(
        Message,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="archive_item",
    )

    class Meta:
        db_table = "pgmb_archive_item"
        indexes = [models.Index(fields=["run", "id"], name="pgmb_archive_item_run")]

    def __str__(self) -> str:
        return f"{self.message_id} in archive run {self.run_id}"


class ArchiveDay(models.Model):
    """A day of history an archive run took whole: its two partitions detached from
    ``pgmb_message`` and ``pgmb_attempt`` (``pgmb.claim_history_day``) and renamed to
    ``message_table`` and ``attempt_table``, which only the run reads.

    The tables are dropped (``dropped_at``) once the run's Parquet is committed. A run that
    stopped before that hands its days to the next run, which writes them again.
    """

    id = models.BigAutoField(primary_key=True)
    # Covered by the (run, day) constraint below.
    run = models.ForeignKey(
        ArchiveRun, on_delete=models.CASCADE, db_index=False, related_name="days"
    )
    #: The UTC day of the message ids (pgmb.history_days()).
    day = models.DateField()
    message_table = models.TextField()
    attempt_table = models.TextField()
    #: Unfinished messages moved to the default partitions when the day was claimed.
    kept = models.BigIntegerField(default=0, db_default=0)
    #: What the tables hold, counted once the run writes them.
    messages = models.BigIntegerField(default=0, db_default=0)
    attempts = models.BigIntegerField(default=0, db_default=0)
    dropped_at = models.DateTimeField(_("tables dropped"), null=True, blank=True)

    class Meta:
        db_table = "pgmb_archive_day"
        verbose_name = _("archived day")
        constraints = [
            models.UniqueConstraint(fields=["run", "day"], name="pgmb_archive_day_run_day")
        ]

    def __str__(self) -> str:
        return f"{self.day} in archive run {self.run_id}"


class TaskResult(models.Model):
    """The state and outcome of one Django task enqueued with :class:`pgmb.tasks.PgmbBackend`.

    Its id is the id of the message that carries the task, so a row and its message are
    written in the same transaction and a rolled-back enqueue leaves neither. Read through
    the Tasks framework (``task.get_result(id)``, ``result.refresh()``), not directly.
    """

    class Status(models.TextChoices):
        # The values of the framework's TaskResultStatus (pgmb's core does not import it).
        READY = "READY", _("ready")
        RUNNING = "RUNNING", _("running")
        FAILED = "FAILED", _("failed")
        SUCCESSFUL = "SUCCESSFUL", _("successful")

    id = models.UUIDField(primary_key=True, editable=False)
    #: The TASKS alias of the backend the task was enqueued with.
    backend = models.CharField(max_length=100)
    #: The task's dotted path (``module.function``), imported by the worker.
    task_path = models.TextField()
    #: The Tasks queue; its messages carry the routing key ``tasks.<queue_name>``.
    queue_name = models.CharField(max_length=100)
    priority = models.SmallIntegerField(default=0, db_default=0)
    run_after = models.DateTimeField(null=True, blank=True)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.READY, db_default="READY"
    )
    enqueued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: What the task returned, as JSON (null until it succeeds).
    return_value = models.JSONField(null=True, blank=True)
    #: One {"exception_class_path": ..., "traceback": ...} per failed attempt, oldest first.
    errors = models.JSONField(default=list, blank=True)
    #: The worker of each attempt, oldest first (its length is the number of attempts).
    worker_ids = ArrayField(models.TextField(), default=list, blank=True)

    class Meta:
        db_table = "pgmb_task_result"
        verbose_name = _("task result")
        ordering = ["-enqueued_at"]
        # OR-ed equalities rather than IN, as for pgmb_archive_run_state.
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status="READY")
                | models.Q(status="RUNNING")
                | models.Q(status="FAILED")
                | models.Q(status="SUCCESSFUL"),
                name="pgmb_task_result_status",
            )
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} ({self.status})"


class Schedule(models.Model):
    """A message published at each due time of a cron expression or an interval
    (docs/schedules.md). Written through ``pgmb.schedule`` (SQL) or
    :func:`pgmb.schedules.schedule`, which check it; fired by the dispatchers and the
    in-database loop (``pgmb.fire_due_schedules``)."""

    class Missed(models.TextChoices):
        SKIP = "skip", _("skip: go on to the next due time after now")
        ONCE = "once", _("once: fire once for the runs missed")
        ALL = "all", _("all: fire every run missed")

    id = models.BigAutoField(primary_key=True)
    name = models.TextField(unique=True)
    #: A 5-field cron expression, read in ``timezone``; or NULL with ``every`` set.
    cron = models.TextField(null=True, blank=True)  # noqa: DJ001 (NULL: an interval schedule)
    every = models.DurationField(null=True, blank=True)
    #: An IANA time zone name, in which ``cron`` is read.
    timezone = models.TextField(_("time zone"), default="UTC", db_default="UTC")
    missed = models.TextField(
        _("missed runs"), choices=Missed.choices, default=Missed.ONCE, db_default="once"
    )
    routing_key = models.TextField()
    #: Any JSON value: blank lets {} and [] through the admin's form (Django takes them
    #: for empty); pgmb.schedule checks the body.
    body = models.JSONField(blank=True)
    headers = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()))
    #: The Django task each run enqueues (pgmb.tasks.schedule_task); NULL: a plain message.
    task = models.JSONField(null=True, blank=True)
    paused = models.BooleanField(default=False, db_default=False)
    next_run_at = models.DateTimeField(_("next run"))
    #: The due times fired last, newest first (up to 10).
    last_runs = ArrayField(models.DateTimeField(), default=list, db_default=[], blank=True)
    #: How many messages it has published.
    runs = models.BigIntegerField(default=0, db_default=0)
    #: Why the last fire could not publish (NULL once one does).
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001 (NULL: none)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgmb_schedule"
        verbose_name = _("schedule")
        ordering = ["name"]
        # Pausing is not "change": the admin's pause and resume actions are granted this.
        permissions = [("pause_schedule", "Can pause and resume schedules")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(cron__isnull=False, every__isnull=True)
                | models.Q(cron__isnull=True, every__isnull=False),
                name="pgmb_schedule_cron_or_every",
            ),
            models.CheckConstraint(
                condition=models.Q(missed="skip")
                | models.Q(missed="once")
                | models.Q(missed="all"),
                name="pgmb_schedule_missed",
            ),
        ]
        # The firers' and pgmb.next_wakeup's look: the earliest due time not paused.
        indexes = [
            models.Index(
                fields=["next_run_at"],
                condition=models.Q(paused=False),
                name="pgmb_schedule_due",
            )
        ]

    def __str__(self) -> str:
        return self.name
