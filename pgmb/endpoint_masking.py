"""How a worker's endpoint is shown: with the credentials of its URL masked.

An endpoint may carry Basic credentials (``https://user:password@host/hook``, sent as an
``Authorization`` header by the transports). Everything that shows or logs an endpoint
(the admin's lists and pages, the test-request page, the dispatcher's error texts) shows
:func:`mask_credentials` of it instead (docs/decisions/0028-secrets-stay-secret-in-the-admin.md).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

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


def keep_credentials(submitted: str, stored: str) -> str:
    """What an edit form's endpoint means: ``submitted``, the credentials of ``stored``
    kept where the form showed them masked.

    The form shows :func:`mask_credentials` of the stored endpoint; an operator who leaves
    the mask in place (changing the host or the path, or nothing) keeps the stored user name
    and password, one who types others sets those, one who removes them removes them.
    """
    try:
        new, old = urlsplit(submitted), urlsplit(stored)
        masked = mask_credentials(stored) != stored
        new_userinfo = new.netloc.rpartition("@")[0] if "@" in new.netloc else None
        old_userinfo = old.netloc.rpartition("@")[0]
    except ValueError:
        return submitted  # the form's validation reports it
    shown = MASK if old.password is None else f"{MASK}:{MASK}"
    if not masked or new_userinfo != shown:
        return submitted
    host = new.netloc.rpartition("@")[2]
    return urlunsplit(new._replace(netloc=f"{old_userinfo}@{host}"))
