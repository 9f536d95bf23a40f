"""How a worker's endpoint is shown: with the credentials of its URL masked.

An endpoint may carry Basic credentials (``https://user:password@host/hook``, sent as an
``Authorization`` header by the transports). Everything that shows or logs an endpoint
(the admin's lists and pages, the test-request page, the dispatcher's error texts) shows
:func:`mask_credentials` of it instead (docs/decisions/0028-secrets-stay-secret-in-the-admin.md).
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit

#: What stands for the user name and for the password.
MASK = "***"


def mask_credentials(url: str) -> str:
    """``url`` with its user name and password replaced by :data:`MASK`.

    ``https://user:pw@host:8443/p?q`` becomes ``https://***:***@host:8443/p?q``, and
    ``https://token@host/`` ``https://***@host/``; a URL without credentials is returned
    as it is. Text that does not parse as a URL is masked whole when it has an ``@``
    (it might hold credentials), returned as it is otherwise.
    """
    try:
        parts = urlsplit(url)
        has_credentials = parts.username is not None or parts.password is not None
    except ValueError:
        return MASK if "@" in url else url
    if not has_credentials:
        return url
    userinfo = MASK if parts.password is None else f"{MASK}:{MASK}"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))


class CredentialsNotCarried(ValueError):
    """An edit kept the masked credentials of an endpoint but changed where they go."""


def _origin(parts: SplitResult) -> tuple[str, str | None, int | None]:
    """Where a URL's requests go, as credentials are bound to it: scheme, host and port
    (the scheme's default port written out). ``ValueError`` for a port out of range."""
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(scheme)


def keep_credentials(submitted: str, stored: str) -> str:
    """What an edit form's endpoint means: ``submitted``, the credentials of ``stored``
    kept where the form showed them masked.

    The form shows :func:`mask_credentials` of the stored endpoint; an operator who leaves
    the mask in place keeps the stored user name and password, one who types others sets
    those, one who removes them removes them. The mask keeps them only while the endpoint's
    scheme, host and port stay those of ``stored``: masked credentials moved to another
    host would be sent there (to a host of whoever may edit the worker, who could then read
    them), so :class:`CredentialsNotCarried` is raised instead, and the credentials must be
    typed again or removed (docs/decisions/0057-masked-credentials-stay-with-their-host.md).
    """
    try:
        new, old = urlsplit(submitted), urlsplit(stored)
        masked = mask_credentials(stored) != stored
        new_userinfo = new.netloc.rpartition("@")[0] if "@" in new.netloc else None
        old_userinfo = old.netloc.rpartition("@")[0]
        same_origin = _origin(new) == _origin(old)
    except ValueError:
        return submitted  # the form's validation reports it
    shown = MASK if old.password is None else f"{MASK}:{MASK}"
    if not masked or new_userinfo != shown:
        return submitted
    if not same_origin:
        raise CredentialsNotCarried(
            "The stored user name and password are kept only while the scheme, host and port "
            "stay the same: type them again for the new address, or remove them."
        )
    host = new.netloc.rpartition("@")[2]
    return urlunsplit(new._replace(netloc=f"{old_userinfo}@{host}"))
