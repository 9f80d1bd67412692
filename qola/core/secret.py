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
* :func:`credential_name` and :func:`recorded_value`: a variable whose name says it holds a
  credential (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*_KEY``, …) is recorded and shown as a
  digest of its value, never the value; :func:`shown` is what every JSON printed goes through.
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

# a URL's scheme (RFC 3986: a letter, then letters, digits, '+', '.', '-'), then "//": where a URL begins
_SCHEME = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://")
_ENDS_AUTHORITY = "/?#"
_PUNCTUATION = ")]}>,.;'\""  # what prose puts after a URL (not read as part of its port)  # RFC 3986: the authority ends at the first of these (or at the end)


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


class UnsplittableURL(ValueError):
    """A URL whose credentials cannot be told from its host and path. Its text names no part of the
    URL; :attr:`hint` says how to fix it. Where a URL is given, it becomes a
    :class:`~qola.core.errors.QolaError` naming where (this module imports nothing of qola's)."""

    hint = "percent-encode them in the URL: '/' as %2F, '@' as %40, ':' as %3A, '#' as %23, '?' as %3F, ' ' as %20"

    def __init__(self) -> None:
        super().__init__(
            "a URL's credentials cannot be told from its host and path (a raw '/', '@', ':', '#', '?' or space "
            "in the user name or password); the URL is not shown"
        )


def _numeric_port(authority: str) -> bool:
    """Whether ``authority`` (no user-info) is a host with no port or a numeric one (``[v6]:port`` too)."""
    host_end = authority.find("]") + 1 if authority.startswith("[") else 0
    port = authority[host_end:].rpartition(":")[2] if ":" in authority[host_end:] else ""
    return port.isdigit() or port == ""


def _ambiguous(authority: str, rest: str) -> bool:
    """An authority without user-info, and what follows it: True when an '@' after it reads as the end
    of credentials that a raw '/', '?' or '#' cut short (``https://u:ab/PW@host``, ``https://tok#en@host``):
    the authority's "port" is no number, or the query or fragment that follows holds an '@' before a '/'."""
    if "@" not in rest:
        return False
    if not _numeric_port(authority):
        return True
    at, slash = rest.find("@"), rest.find("/")
    return rest[:1] in ("?", "#") and (slash < 0 or at < slash)


def split_url(url: str) -> tuple[str, Secret | None]:
    """``url`` without the credentials of its authority (``scheme://user:pw@host`` → ``scheme://host``),
    and those credentials (``user:pw``, or a bare token) as a :class:`Secret` (None: it had none).

    Parsed, not matched: the authority ends at the first '/', '?' or '#' (RFC 3986); its user-info is
    what comes before its last '@'. A URL whose credentials cannot be told apart unambiguously raises
    :class:`UnsplittableURL`, which names no part of it: user-info holding a space or a control
    character, or an '@' after an authority whose port is no number or in a query or fragment before
    any '/' (a raw '/', '?' or '#' in a password ends the authority early)."""
    m = _SCHEME.match(url)
    if not m:
        return url, None
    body = url[m.end() :]
    end = min((i for i in (body.find(c) for c in _ENDS_AUTHORITY) if i >= 0), default=len(body))
    authority, rest = body[:end], body[end:]
    if "@" not in authority:
        if _ambiguous(authority, rest):
            raise UnsplittableURL
        return url, None
    userinfo, _, host = authority.rpartition("@")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in userinfo):
        raise UnsplittableURL
    return m.group(0) + host + rest, Secret(userinfo)


def basic_authorization(credentials: Secret) -> str:
    """The ``Authorization`` header value for ``user:password`` (percent-escapes undone, as in a URL):
    where a URL's credentials are handed over (an HTTP request, git's environment-only config)."""
    import base64  # lazy: paid only where credentials are handed over
    import urllib.parse  # lazy: paid only where credentials are handed over

    user, _, password = credentials.reveal().partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def _masked_end(text: str, start: int) -> int | None:
    """For a URL whose authority begins at ``start`` of ``text``: the index of the '@' that ends its
    user-info (None: it has none). Its authority ends at '/', '?', '#' or white space; when that reads
    as credentials cut short (:func:`_ambiguous`: a raw '/', '?', '#' or space in a password), the
    user-info runs to the last '@' before the first '/' after an '@', on the same line (a space cuts a
    password short only after a "port" that is no number: ``https://alice:pa ss@host``)."""
    end = start
    while end < len(text) and text[end] not in _ENDS_AUTHORITY and not text[end].isspace():
        end += 1
    authority = text[start:end]
    if "@" in authority:
        return start + authority.rindex("@")
    line_end = text.find("\n", end)
    line = text[end : len(text) if line_end < 0 else line_end]
    cut = end < len(text) and text[end] in "?#"  # a space after a host alone is prose, not a password
    if "@" not in line or not (cut or not _numeric_port(authority.rstrip(_PUNCTUATION))):
        return None
    slash = line.find("/", line.index("@"))
    head = line if slash < 0 else line[:slash]
    return end + head.rindex("@")


def redact(text: str) -> str:
    """``text`` with every URL's credentials replaced by ``***`` (``https://***@host/…``), whatever their
    characters: the same parse as :func:`split_url`, and where that would refuse a URL, everything up
    to the '@' that could end its credentials is masked (the mask errs on the side of hiding)."""
    if "://" not in text or "@" not in text:
        return text
    out, pos = [], 0
    for m in _SCHEME.finditer(text):
        if m.start() < pos:
            continue
        at = _masked_end(text, m.end())
        if at is not None:
            out += [text[pos : m.end()], MASK]
            pos = at
    return "".join(out) + text[pos:]


def fingerprint(value: str) -> str:
    """A hash of ``value`` (:func:`redact` first: a URL's credentials change nothing built), what a
    record keeps instead of a value that may be a secret (a variable a generator looked up)."""
    return hashlib.sha256(redact(value).encode("utf-8", "surrogateescape")).hexdigest()


# a variable whose name says it holds a credential: *TOKEN*, *SECRET*, *PASSWORD* (PASSWD, PASSPHRASE),
# *CREDENTIAL*, *COOKIE*, *_KEY / KEY_* (API_KEY, ACCESS_KEY…), *_AUTH*
_CREDENTIAL_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|COOKIE|(?:^|_)(?:KEY|AUTH)(?:$|_)")


def credential_name(name: str) -> bool:
    """Whether a variable's name says its value is a credential (:data:`_CREDENTIAL_NAME`, any case)."""
    return bool(_CREDENTIAL_NAME.search(name.upper()))


def recorded_value(name: str, value: str) -> str:
    """How the variable ``name`` set to ``value`` is shown or recorded (manifest.json, the no-op record,
    the build key's JSON): a credential-like name's value as ``sha256:<digest>`` (a change still
    counts, the value is never kept), any other's with its URLs' credentials masked (:func:`redact`)."""
    return f"sha256:{fingerprint(value)}" if credential_name(name) else redact(value)


def shown(value: object) -> object:
    """``value`` (JSON-like: dicts, lists, tuples, strings, numbers) as it may be printed or written:
    every string, keys too, :func:`redact`-ed. What every JSON qola prints goes through (the
    variables a build records are :func:`recorded_value` already, where their view is made)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(v) for v in value]
    return value


def redact_argv(argv: Sequence[str]) -> list[str]:
    """:func:`redact` of each argument (the command line as a lock or a record keeps it)."""
    return [redact(str(a)) for a in argv]
