"""Secrets (a password, a token, a key): one type that never shows its value.

* :class:`Secret` holds the value; ``str``, ``repr``, ``format`` and f-strings give ``***``, JSON
  and pickle refuse it (a secret never enters a key, a record or a log by accident); only
  :meth:`Secret.reveal`, called where the value is handed to what needs it (an HTTP header, git's
  environment), gives it back.
* :func:`split_url` takes the credentials out of a URL (``scheme://user:password@host/…``): the URL
  without them, and a :class:`Secret` of ``user:password``. Every URL qola is given (``--remote``,
  ``--prebuilt``, ``--aiter-url``/``[qola] aiter_url``/``QOLA_AITER_URL``) goes through it before it
  is shown, recorded or passed on.
* :func:`fingerprint` is how a value that may hold one is kept in a record (a variable a generator
  read): a hash of it, credentials masked first.
* :func:`redact` is the last line of defence for text qola writes to the console, a log or a file
  (error messages, the argv recorded in a lock or the no-op record): every URL's credentials become
  ``***``.

Standard library only, nothing at import time.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import NoReturn

MASK = "***"

# scheme://userinfo@ — userinfo is everything up to the last '@' before the host (no '/', no space)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]*(?:@[^/?#@\s]*)*)@")


class Secret:
    """A secret value: shows as ``***`` everywhere; :meth:`reveal` is the one way to its value."""

    __slots__ = ("_value",)
    _value: str

    def __init__(self, value: str):
        object.__setattr__(self, "_value", value)

    def reveal(self) -> str:
        return self._value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Secret is immutable")

    def __repr__(self) -> str:
        return f"Secret({MASK})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is never pickled (nor written into a record)")

    def __getstate__(self) -> NoReturn:
        raise TypeError("a Secret is never pickled (nor written into a record)")


# scheme://<authority, no '@'>:<not a port>…@ — a password with a raw '/' (RFC 3986 ends the authority
# there): ``https://u:ab/PW@host/store`` is no URL whose host is ``u`` on port ``ab``; it is credentials
# that cannot be told from the path. ``host:8080/pkg@1.0`` (a numeric port) is a path with an '@'.
_UNSPLITTABLE = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s:]*:(?![0-9]*(?:[/?#\s]|$))[^?#@\s]*(?:@[^?#@\s]*)*)@"
)


class UnsplittableURL(ValueError):
    """A URL whose credentials cannot be told from its host and path. Its text names no part of the
    URL; :attr:`hint` says how to fix it. Where a URL is given, it becomes a
    :class:`~qola.core.errors.QolaError` naming where (this module imports nothing of qola's)."""

    hint = "percent-encode them in the URL: '/' as %2F, '@' as %40, ':' as %3A"

    def __init__(self) -> None:
        super().__init__(
            "a URL's credentials cannot be told from its host and path (a raw '/', '@' or ':' in the user "
            "name or password); the URL is not shown"
        )


def split_url(url: str) -> tuple[str, Secret | None]:
    """``url`` without the credentials of its authority (``scheme://user:pw@host`` → ``scheme://host``),
    and those credentials (``user:pw``, or a bare token) as a :class:`Secret` (None: it had none).
    A URL whose user-info holds a raw ``/`` (so its end cannot be found) raises
    :class:`UnsplittableURL`, which names no part of it."""
    m = _USERINFO.match(url)
    if not m:
        if _UNSPLITTABLE.match(url):
            raise UnsplittableURL
        return url, None
    return m.group("scheme") + url[m.end() :], Secret(m.group("userinfo"))


def basic_authorization(credentials: Secret) -> str:
    """The ``Authorization`` header value for ``user:password`` (percent-escapes undone, as in a URL):
    where a URL's credentials are handed over (an HTTP request, git's environment-only config)."""
    import base64  # lazy: paid only where credentials are handed over
    import urllib.parse  # lazy: paid only where credentials are handed over

    user, _, password = credentials.reveal().partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def redact(text: str) -> str:
    """``text`` with every URL's credentials replaced by ``***`` (``https://***@host/…``)."""
    if "://" not in text or "@" not in text:
        return text
    text = _UNSPLITTABLE.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def fingerprint(value: str) -> str:
    """A hash of ``value`` (:func:`redact` first: a URL's credentials change nothing built), what a
    record keeps instead of a value that may be a secret (a variable a generator looked up)."""
    return hashlib.sha256(redact(value).encode("utf-8", "surrogateescape")).hexdigest()


def redact_argv(argv: Sequence[str]) -> list[str]:
    """:func:`redact` of each argument (the command line as a lock or a record keeps it)."""
    return [redact(str(a)) for a in argv]
