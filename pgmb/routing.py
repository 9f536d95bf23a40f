"""Names, routing keys and binding keys: validation and compilation.

These rules are enforced twice on purpose: here, so forms and the Python API fail early
with a readable message, and in SQL (functions of schema ``pgmb``), so every other producer is held
to them too. ``tests/sql/test_routing.py`` checks that both compile identically, and
``tests/rules/test_shared_rules.py`` that both sides give every input the same verdict.

The key rule (routing and binding keys; ``pgmb.valid_key``, ``pgmb.check_key`` and the CHECK
``pgmb_message_routing_key_valid`` in SQL): a key is a non-empty text of at most 255
characters with no blank or control character. "Blank or control character" is the explicit
class :data:`KEY_FORBIDDEN`, written out identically in the SQL: the ASCII controls and
space (U+0000-U+0020), DEL and the C1 controls (U+007F-U+009F, which hold U+0085), the
other Unicode whitespace that ``str.isspace()`` knows (U+00A0, U+1680, U+2000-U+200A,
U+2028, U+2029, U+202F, U+205F, U+3000), and U+FEFF (the byte-order mark). A routing key
has no ``*`` or ``#`` either; in a binding key they are whole words.

Topic rules (AMQP, as RabbitMQ users know them): keys are words separated by dots; in a
binding key ``*`` matches exactly one word and ``#`` matches zero or more words. Words may
be empty (``a..b`` has three words). Everything else is literal.
"""

from __future__ import annotations

import re

from .errors import InvalidBindingKey, InvalidName, InvalidRoutingKey

# Used with fullmatch: "$" would also match before a trailing newline.
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
#: Longest base name: "<base>_dead_letter_queue" must fit PostgreSQL's 63-byte identifiers.
MAX_BASE_LENGTH = 63 - len("_dead_letter_queue")
MAX_KEY_LENGTH = 255
#: The blanks and control characters a key may not hold, as a regex character class whose
#: text is the same in Python ``re`` and in PostgreSQL's regexes (``\uHHHH`` escapes mean the
#: same code point in both). ``pgmb.valid_key`` in SQL contains this very text.
KEY_FORBIDDEN = (
    r"[\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
)
_FORBIDDEN = re.compile(KEY_FORBIDDEN)
#: Characters with a meaning in both Python and PostgreSQL (ARE) regexes.
_REGEX_META = frozenset("\\^$.|?*+()[]{}")


def validate_name(name: object, kind: str = "queue") -> str:
    """Return ``name`` if it is a valid worker or queue name, else raise :class:`InvalidName`."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidName(
            f"invalid {kind} name {name!r}: use 1 to 48 characters, lower-case letters, "
            "digits and underscores, starting with a letter"
        )
    if kind == "queue":
        base = view_base(name)
        if base.endswith("_dead_letter"):
            raise InvalidName(
                f"invalid queue name {name!r}: a name may not end in '_dead_letter' "
                "(its views would clash with another queue's dead-letter view)"
            )
        if len(base) > MAX_BASE_LENGTH:
            raise InvalidName(
                f"invalid queue name {name!r}: without a trailing '_queue' it may have at most "
                f"{MAX_BASE_LENGTH} characters, so that its views' names fit PostgreSQL"
            )
    return name


def view_base(queue_name: str) -> str:
    """The stem of a queue's views: ``order_queue`` and ``order`` both give ``order``."""
    return queue_name[: -len("_queue")] if queue_name.endswith("_queue") else queue_name


def queue_view_names(queue_name: str) -> tuple[str, str]:
    """The seed's per-queue views: ``(pgmb.<base>_queue, pgmb.<base>_dead_letter_queue)``."""
    base = view_base(queue_name)
    return f"{base}_queue", f"{base}_dead_letter_queue"


def _check_key(key: object, what: str, error: type[ValueError]) -> str:
    if not isinstance(key, str) or not key:
        raise error(f"invalid {what} {key!r}: it must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise error(f"invalid {what}: longer than {MAX_KEY_LENGTH} characters")
    if _FORBIDDEN.search(key):
        raise error(f"invalid {what} {key!r}: blanks and control characters are not allowed")
    return key


def validate_routing_key(key: object) -> str:
    """Return ``key`` if it is a valid routing key, else raise :class:`InvalidRoutingKey`."""
    _check_key(key, "routing key", InvalidRoutingKey)
    assert isinstance(key, str)
    if "*" in key or "#" in key:
        raise InvalidRoutingKey(
            f"invalid routing key {key!r}: '*' and '#' are wildcards, only binding keys use them"
        )
    return key


def validate_binding_key(key: object) -> str:
    """Return ``key`` if it is a valid binding key, else raise :class:`InvalidBindingKey`."""
    _check_key(key, "binding key", InvalidBindingKey)
    assert isinstance(key, str)
    for word in key.split("."):
        if word not in ("*", "#") and ("*" in word or "#" in word):
            raise InvalidBindingKey(
                f"invalid binding key {key!r}: wildcards must be whole words "
                f"(got {word!r}; write 'a.*' or 'a.#', not 'a*')"
            )
    return key


def compile_binding(key: str) -> str:
    """Compile a binding key to the anchored regex stored on the queue.

    The regex is matched against ``'.' || routing_key``: with every word preceded by a dot,
    ``#`` becomes "any number of dot-words" without special cases at the ends.
    """
    validate_binding_key(key)
    parts = []
    for word in key.split("."):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + "".join("\\" + c if c in _REGEX_META else c for c in word))
    return "^" + "".join(parts) + "$"


def matches(pattern: str, routing_key: str) -> bool:
    """Whether a compiled binding ``pattern`` routes ``routing_key`` (same test as the SQL)."""
    return (
        re.match(pattern, "." + routing_key) is not None
    )  # patterns end in "$" but keys hold no newline
