"""A child's output held bounded (:mod:`qola.core.proc` runs the child): one captured stream whole up
to a limit or cut in the middle (:class:`Kept`), the lines kept for a log (:class:`Lines`), and a
text stream read in lines of bounded length (:func:`read_lines`). Standard library only.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

LOG_KEEP = 2 << 20  # bytes of a child's output kept for a log (head and tail) by ``keep=LOG_KEEP``
CHUNK = 1 << 16  # bytes read at once


class Overflow(Exception):
    """A stream held whole grew past its limit; ``held``: the end of what it held."""

    def __init__(self, held: bytes):
        super().__init__(len(held))
        self.held = held


class Kept:
    """One captured stream: whole up to ``limit`` bytes (more: :class:`OutputLimit`), or with ``keep``
    its first and last ``keep/2`` bytes and a count of what was cut between them. The tail is a queue
    of the chunks as read, whole chunks dropped from its front: no large buffer is regrown or moved,
    so memory stays about ``keep``."""

    def __init__(self, limit: int, keep: int | None):
        self.limit, self.keep = limit, keep
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_bytes = 0
        self.cut = 0

    def write(self, data: bytes) -> None:
        if self.keep is None:
            if len(self.head) + len(data) > self.limit:
                raise Overflow(bytes(self.head[-4096:]))
            self.head += data
            return
        room = self.keep // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_bytes += len(data)
        while self.tail and self.tail_bytes - len(self.tail[0]) >= self.keep // 2:
            dropped = len(self.tail.popleft())
            self.tail_bytes -= dropped
            self.cut += dropped

    def value(self) -> bytes:
        tail = b"".join(self.tail)
        cut = self.cut
        if self.keep is not None and len(tail) > self.keep // 2:
            cut += len(tail) - self.keep // 2
            tail = tail[len(tail) - self.keep // 2 :]
        if not cut:
            return bytes(self.head) + tail
        note = f"\n[… qola cut {cut} bytes ({cut >> 20} MiB) of output here …]\n".encode()
        return bytes(self.head) + note + tail


class Lines:
    """Lines of a child's output kept for a log, at most about ``keep`` bytes: the first and last
    ``keep/2`` bytes' worth, and one line saying how many were cut between them."""

    def __init__(self, keep: int = LOG_KEEP):
        self.keep = keep
        self.head: list[str] = []
        self.tail: collections.deque[str] = collections.deque()
        self.head_bytes = self.tail_bytes = 0
        self.cut_lines = self.cut_bytes = 0

    def append(self, line: str) -> None:
        if not self.tail and self.head_bytes + len(line) <= self.keep // 2:
            self.head.append(line)
            self.head_bytes += len(line) + 1
            return
        self.tail.append(line)
        self.tail_bytes += len(line) + 1
        while self.tail_bytes > self.keep // 2 and len(self.tail) > 1:
            gone = self.tail.popleft()
            self.tail_bytes -= len(gone) + 1
            self.cut_lines += 1
            self.cut_bytes += len(gone) + 1

    def lines(self) -> list[str]:
        note = (
            [f"[… qola cut {self.cut_lines} line(s), {self.cut_bytes} bytes of output here …]"]
            if self.cut_lines
            else []
        )
        return [*self.head, *note, *self.tail]


def read_lines(stream: Any, longest: int = CHUNK) -> Iterator[str]:
    """The lines of a text stream, none longer than ``longest`` characters (a longer one comes in
    pieces): a child printing one endless line is never held whole."""
    while True:
        line = stream.readline(longest)
        if not line:
            return
        yield line
