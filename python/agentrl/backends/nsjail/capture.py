"""What comes back from a jail: the program's output streams, capped (:class:`_Capture`), and
nsjail's log, parsed for its exit status, signal, time limit and errors (:func:`_parse_log`)."""

from __future__ import annotations

import re
from dataclasses import dataclass


class _Capture:
    """One output stream: the first ``cap`` bytes are kept, the rest is drained and dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    def feed(self, b: bytes) -> None:
        room = self.cap - self.size
        if room > 0:
            keep = b[:room]
            self.chunks.append(keep)
            self.size += len(keep)
        if len(b) > max(room, 0):
            self.truncated = True

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


# ---------------------------------------------------------------------------------------------
# nsjail's log

_RE_EXITED = re.compile(r"exited with status: (\d+)")
_RE_SIGNALED = re.compile(r"terminated with signal: \S+ \((\d+)\)")
_RE_TIMELIMIT = re.compile(r"run time >= time limit")
_RE_EXECVE = re.compile(r"execve\('((?:[^']|'(?!\) failed))*)'\) failed: (.*)$")


@dataclass
class _LogVerdict:
    exit_code: int | None = None
    signal: int | None = None
    time_limit: bool = False
    exec_error: str | None = None
    errors: tuple[str, ...] = ()


def _parse_log(text: str) -> _LogVerdict:
    v = _LogVerdict()
    errors = []
    for line in text.splitlines():
        if m := _RE_EXITED.search(line):
            v.exit_code, v.signal = int(m.group(1)), None
        elif m := _RE_SIGNALED.search(line):
            v.signal, v.exit_code = int(m.group(1)), None
        elif _RE_TIMELIMIT.search(line):
            v.time_limit = True
        if m := _RE_EXECVE.search(line):
            v.exec_error = m.group(2).strip()
        elif line.startswith(("[E]", "[F]")):
            errors.append(re.sub(r"^\[[EF]\]\[[^]]*\]\[\d+\] ", "", line))
    v.errors = tuple(errors)
    return v
