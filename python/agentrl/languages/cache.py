"""The compile cache: a program judged on 20 cases compiles once.

Keyed by language, the compile argv (its flags), the toolchain's fingerprint, and a SHA-256
of the source and of every file the compile box gets (a header passed in ``files`` changes
the program). An in-memory LRU bounded in entries and bytes; thread-safe and asyncio-safe;
concurrent compiles of one key coalesce (one runs, the others wait for its result, from
threads or coroutines alike). What is kept: a successful compile (its artifact), and a compile
the compiler itself rejected (a non-zero exit: deterministic). Not kept: a compile stopped by
a limit (time-out, memory, output) or a sandbox error, which may not happen again on a less
loaded host; their waiters still get that one result.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from agentrl.sandbox.result import ExecResult, Status

__all__ = ["CompileCache", "Compiled", "compile_key", "default_cache"]


@dataclass(frozen=True)
class Compiled:
    """The outcome of one compile step."""

    result: ExecResult
    """The compile's verdict (without its collected files; those are ``artifacts``)."""
    artifacts: dict[str, bytes] = field(default_factory=dict)
    """What the runs get (empty when the compile failed)."""
    ok: bool = False
    """The compile succeeded and left its artifact."""

    @property
    def size(self) -> int:
        """Bytes it holds (what the cache's byte bound counts)."""
        r = self.result
        return sum(len(v) for v in self.artifacts.values()) + len(r.stdout) + len(r.stderr) + 256

    @property
    def cacheable(self) -> bool:
        """A success, or the compiler's own refusal (deterministic); never a limit or a
        sandbox error."""
        return self.ok or self.result.status is Status.RUNTIME_ERROR


def compile_key(
    language: str,
    argv: Sequence[str],
    fingerprint: object,
    source: str,
    files: Mapping[str, bytes],
    env: Sequence[tuple[str, str]] = (),
) -> str:
    """The cache key: a SHA-256 over everything that determines the compile's outcome."""
    h = hashlib.sha256()
    for part in (language, "\0".join(argv), repr(fingerprint), repr(tuple(env))):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\xff")
    h.update(source.encode("utf-8", "surrogatepass"))
    for name in sorted(files):
        h.update(b"\xfe" + name.encode("utf-8", "surrogatepass") + b"\xff")
        h.update(hashlib.sha256(files[name]).digest())
    return h.hexdigest()


class _Abandoned(Exception):
    """The compile a waiter joined stopped without a result (cancelled, or it raised)."""


class CompileCache:
    """An LRU of :class:`Compiled` by :func:`compile_key`, with coalescing.

    ``max_entries`` and ``max_bytes`` bound it (least recently used entries go first; an entry
    larger than ``max_bytes`` is not kept). :meth:`stats` counts ``hits`` (served from the
    cache), ``coalesced`` (joined a compile in flight), ``misses`` (compiled), ``evictions``.
    """

    def __init__(self, max_entries: int = 512, max_bytes: int = 256 << 20) -> None:
        for name, v in (("max_entries", max_entries), ("max_bytes", max_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Compiled] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[str, Future[Compiled]] = {}
        self._hits = self._misses = self._coalesced = self._evictions = 0

    def _lookup(self, key: str) -> tuple[Compiled | None, Future[Compiled] | None, bool]:
        """``(entry, None, _)`` on a hit; else ``(None, future, leader)``."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return hit, None, False
            fut = self._inflight.get(key)
            if fut is not None:
                self._coalesced += 1
                return None, fut, False
            fut = Future()
            self._inflight[key] = fut
            return None, fut, True

    def _settle(self, key: str, fut: Future[Compiled], value: Compiled | None) -> None:
        with self._lock:
            if self._inflight.get(key) is fut:
                del self._inflight[key]
            if value is not None:
                self._misses += 1
                if value.cacheable and self.max_entries and value.size <= self.max_bytes:
                    old = self._entries.pop(key, None)
                    if old is not None:
                        self._bytes -= old.size
                    self._entries[key] = value
                    self._bytes += value.size
                    while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                        _, gone = self._entries.popitem(last=False)
                        self._bytes -= gone.size
                        self._evictions += 1
        try:
            if value is None:
                fut.set_exception(_Abandoned())
            else:
                fut.set_result(value)
        except InvalidStateError:  # pragma: no cover - nobody else settles it
            pass

    def get_or_compile(self, key: str, compile: Callable[[], Compiled]) -> tuple[Compiled, bool]:
        """The cached outcome of ``key``, or ``compile()``'s (blocking); ``(outcome, cached)``
        where ``cached`` is true when this call did not compile itself."""
        while True:
            hit, fut, leader = self._lookup(key)
            if hit is not None:
                return hit, True
            assert fut is not None
            if not leader:
                try:
                    return fut.result(), True
                except _Abandoned:
                    continue  # the leader stopped: try again (perhaps as the leader)
            value = None
            try:
                value = compile()
                return value, False
            finally:
                self._settle(key, fut, value)

    async def aget_or_compile(
        self, key: str, compile: Callable[[], Awaitable[Compiled]]
    ) -> tuple[Compiled, bool]:
        """:meth:`get_or_compile` from a coroutine; cancelling a waiter leaves the compile
        it joined running for the others."""
        import asyncio

        while True:
            hit, fut, leader = self._lookup(key)
            if hit is not None:
                return hit, True
            assert fut is not None
            if not leader:
                try:
                    return await asyncio.shield(asyncio.wrap_future(fut)), True
                except _Abandoned:
                    continue
            value = None
            try:
                value = await compile()
                return value, False
            finally:
                self._settle(key, fut, value)

    def stats(self) -> dict[str, int]:
        """Counters and size: hits, coalesced, misses, evictions, entries, bytes, inflight."""
        with self._lock:
            return {
                "hits": self._hits,
                "coalesced": self._coalesced,
                "misses": self._misses,
                "evictions": self._evictions,
                "entries": len(self._entries),
                "bytes": self._bytes,
                "inflight": len(self._inflight),
            }

    def clear(self) -> None:
        """Drops every entry and zeroes the counters (compiles in flight finish normally)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._hits = self._misses = self._coalesced = self._evictions = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        s = self.stats()
        return f"<agentrl.languages.CompileCache entries={s['entries']} bytes={s['bytes']}>"


_default = CompileCache()


def default_cache() -> CompileCache:
    """The process's shared cache (what :func:`~agentrl.languages.run_code` uses by default)."""
    return _default
