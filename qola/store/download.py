"""Fetching one file of a prebuilt store (:mod:`qola.store.prebuilt`): from a local dir or an
``http(s)://`` base URL (timeouts, size limits, redirects to other schemes refused, credentials only
in a header and only to the host they were given for), checked against its ``<name>.sha256``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from qola import __version__
from qola.core import fsutil, inputs
from qola.core.errors import QolaError
from qola.core.secret import Secret, UnsplittableURL, basic_authorization, split_url

MAX_ARCHIVE = 16 << 30  # bytes fetched for one archive
MAX_SIDECAR = 64 << 10  # <archive>.sha256
TIMEOUT = 60.0  # seconds without progress on one HTTP connection
DEADLINE = 4 * 3600.0  # seconds for one whole download
CHUNK = 1 << 20
HINT_STORE = "the prebuilt store holds a damaged or foreign archive: remove it, or build without --prebuilt"
_SHA_LINE = re.compile(r"([0-9a-fA-F]{64})(?:[ \t]+\*?(\S+))?\s*\Z")


class Missing(Exception):
    """No archive for this key in the store (or the store could not be reached): build instead."""


def is_url(source: str) -> bool:
    return bool(re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", source))


def _opener() -> Any:
    import urllib.parse  # lazy: paid only by the callers that need it
    import urllib.request  # lazy: paid only by the callers that need it

    class SameSchemes(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
                raise QolaError(f"{req.full_url} redirects to {newurl}: only http(s) is followed")
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
                new.remove_header("Authorization")  # the credentials go to the host they were given for only
            return new

    return urllib.request.build_opener(SameSchemes)


def _http_get(
    url: str, sink: Callable[[bytes], None], limit: int, timeout: float, credentials: Secret | None = None
) -> None:
    """``url`` (no credentials in it) into ``sink``; ``credentials``, taken out of the URL the user
    gave (:func:`qola.core.secret.split_url`), go in an Authorization header."""
    import http.client  # lazy: paid only by the callers that need it
    import time  # lazy: paid only by the callers that need it
    import urllib.error  # lazy: paid only by the callers that need it
    import urllib.request  # lazy: paid only by the callers that need it

    headers = {"User-Agent": f"qola/{__version__}"}
    if credentials:
        headers["Authorization"] = basic_authorization(credentials)
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = _opener().open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise Missing(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        raise Missing(f"{url}: cannot connect ({getattr(exc, 'reason', exc)})") from None
    with resp:
        length = resp.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        if expected is not None and expected > limit:
            raise QolaError(f"{url} is {expected} bytes, over the limit of {limit}", hint=HINT_STORE)
        got, end = 0, time.monotonic() + DEADLINE
        try:
            while chunk := resp.read(CHUNK):
                got += len(chunk)
                if got > limit:
                    raise QolaError(f"{url} is over the limit of {limit} bytes", hint=HINT_STORE)
                if time.monotonic() > end:
                    raise QolaError(f"download of {url} took over {DEADLINE:.0f} s", hint="try again")
                sink(chunk)
        except (http.client.IncompleteRead, OSError, http.client.HTTPException) as exc:
            raise QolaError(
                f"download of {url} broke off after {got} bytes ({type(exc).__name__}: {exc})",
                hint="try again; nothing was installed",
            ) from None
        if expected is not None and got != expected:
            raise QolaError(
                f"download of {url} is truncated: {got} of {expected} bytes", hint="try again; nothing was installed"
            )


def _local_get(path: Path, sink: Callable[[bytes], None], limit: int) -> None:
    try:
        fd, _ = inputs.open_checked(path, limit=limit, what="prebuilt file", hint=HINT_STORE)
    except FileNotFoundError:
        raise Missing(f"{path} does not exist") from None
    with os.fdopen(fd, "rb") as fh:
        got = 0
        while chunk := fh.read(CHUNK):
            got += len(chunk)
            if got > limit:
                raise QolaError(f"{path} grew over the limit of {limit} bytes", hint=HINT_STORE)
            sink(chunk)


def get(source: str, name: str, sink: Callable[[bytes], None], limit: int, timeout: float) -> str:
    """Stream ``<source>/<name>`` into ``sink``; returns where it came from."""
    if is_url(source):
        import urllib.parse  # lazy: paid only by the callers that need it

        try:
            public, credentials = split_url(source)  # user:password never shown, recorded or logged
        except UnsplittableURL as exc:
            raise QolaError(f"--prebuilt: {exc}", hint=exc.hint) from None
        if urllib.parse.urlsplit(public).scheme.lower() not in ("http", "https"):
            raise QolaError(f"--prebuilt {public}: only a directory or an http(s):// URL is supported")
        url = public.rstrip("/") + "/" + urllib.parse.quote(name)
        _http_get(url, sink, limit, timeout, credentials)
        return url
    path = Path(source) / name
    _local_get(path, sink, limit)
    return str(path)


def expected_sha256(text: bytes, name: str, where: str) -> str:
    """The sha256 a ``<archive>.sha256`` file gives for ``name`` (``sha256sum`` format)."""
    try:
        line = text.decode("ascii").strip().splitlines()[0] if text.strip() else ""
    except UnicodeDecodeError:
        line = ""
    m = _SHA_LINE.match(line)
    if not m:
        raise QolaError(f"{where} is not a sha256 line ('<64 hex digits>  {name}')", hint=HINT_STORE)
    if m.group(2) is not None and m.group(2) != name:
        raise QolaError(f"{where} names {m.group(2)!r}, not {name!r}", hint=HINT_STORE)
    return m.group(1).lower()


def fetch(
    source: str, name: str, into: Path, *, limit: int = MAX_ARCHIVE, timeout: float = TIMEOUT
) -> tuple[Path, str]:
    """``<source>/<name>`` downloaded (or copied) into the dir ``into`` and checked against
    ``<source>/<name>.sha256``; (the local file, where it came from). Missing: not in the store."""
    side = bytearray()
    where = get(source, f"{name}.sha256", side.extend, MAX_SIDECAR, timeout)
    want = expected_sha256(bytes(side), name, where)
    local = into / name
    h = hashlib.sha256()
    origin = ""

    def fill(fh: BinaryIO) -> None:
        nonlocal origin

        def sink(chunk: bytes) -> None:
            h.update(chunk)
            fh.write(chunk)

        origin = get(source, name, sink, limit, timeout)
        if h.hexdigest() != want:  # checked before the file takes its name: a bad one never does
            raise QolaError(
                f"{origin} has sha256 {h.hexdigest()}, but {where} says {want}: refused (a damaged, "
                "truncated or replaced archive); nothing was installed",
                hint=HINT_STORE,
            )

    fsutil.atomic_stream(local, fill)  # the one file-write primitive (qola.core.fsutil)
    return local, origin
