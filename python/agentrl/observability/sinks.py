"""Where trace records go, and how they are read back.

* :class:`JsonlSink`: ``traces-NNNNNN.jsonl`` files in a directory, one JSON object a line; a
  file is closed at ``max_bytes`` and the oldest are deleted beyond ``max_files``.
* :class:`SqliteSink`: ``traces.sqlite``, a table of records with the usual filter fields as
  columns and an FTS5 index of their text (output, errors, tracebacks, ids) for full-text
  search.

Sinks are written by the tracer's one writer thread (:meth:`TraceSink.write` takes a batch).
:func:`open_reader` opens a trace directory for :mod:`agentrl.observability.traces`' search.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

__all__ = ["JsonlSink", "SqliteSink", "TraceSink", "open_reader"]

_TEXT_FIELDS = (
    "stdout", "stderr", "error", "traceback", "failing_test", "feedback", "task_id",
    "status", "error_class", "language", "trace_id",
)  # fmt: skip
_COLUMNS = (
    "trace_id", "kind", "time", "job", "task_id", "episode", "group", "policy_version",
    "language", "judge", "status", "outcome", "error_class", "limit", "source_sha256",
)  # fmt: skip


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _dumps(rec: dict) -> str:
    return json.dumps({k: _clean(v) for k, v in rec.items()}, default=str)


class TraceSink(Protocol):
    """Where a :class:`~agentrl.observability.traces.Tracer` writes."""

    def write(self, records: list[dict[str, Any]]) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Rotating JSONL files in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 64 << 20,
                 max_files: int = 20) -> None:  # fmt: skip
        if max_bytes < 1 or max_files < 1:
            raise ValueError("max_bytes and max_files must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.max_files = max_bytes, max_files
        existing = sorted(self.directory.glob("traces-*.jsonl"))
        self._index = int(existing[-1].stem.split("-")[1]) + 1 if existing else 1
        self._f: Any = None
        self._size = 0

    def _open(self) -> None:
        path = self.directory / f"traces-{self._index:06d}.jsonl"
        self._index += 1
        self._f = path.open("a", encoding="utf-8")
        self._size = path.stat().st_size
        files = sorted(self.directory.glob("traces-*.jsonl"))
        for old in files[: max(0, len(files) - self.max_files)]:
            with contextlib.suppress(OSError):
                old.unlink()

    def write(self, records: list[dict[str, Any]]) -> None:
        if self._f is None:
            self._open()
        text = "".join(_dumps(r) + "\n" for r in records)
        self._f.write(text)
        self._f.flush()
        self._size += len(text)
        if self._size >= self.max_bytes:
            self._f.close()
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS traces (
    id INTEGER PRIMARY KEY,
    {", ".join(f'"{c}"' for c in _COLUMNS)},
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_task ON traces(task_id);
CREATE INDEX IF NOT EXISTS traces_trace ON traces(trace_id);
CREATE INDEX IF NOT EXISTS traces_status ON traces(status);
CREATE VIRTUAL TABLE IF NOT EXISTS traces_fts USING fts5(body, content='', tokenize='unicode61');
"""


class SqliteSink:
    """Records in a SQLite database with an FTS5 index of their text."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        # Made on the writer thread, which is the only one to use it.
        if self._db is None:
            self._db = sqlite3.connect(self.path)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        return self._db

    def write(self, records: list[dict[str, Any]]) -> None:
        db = self._conn()
        cols = ", ".join(f'"{c}"' for c in _COLUMNS)
        marks = ", ".join("?" * (len(_COLUMNS) + 1))
        with db:
            for r in records:
                cur = db.execute(
                    f"INSERT INTO traces ({cols}, record) VALUES ({marks})",
                    [_scalar(r.get(c)) for c in _COLUMNS] + [_dumps(r)],
                )
                db.execute(
                    "INSERT INTO traces_fts(rowid, body) VALUES (?, ?)", (cur.lastrowid, _body(r))
                )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (int, float, str)):
        return v
    return str(v)


def _body(r: dict[str, Any]) -> str:
    parts = [str(r[k]) for k in _TEXT_FIELDS if r.get(k)]
    parts += list(r.get("denied_syscalls") or ())
    return "\n".join(parts)


# ---- reading
def _matches(rec: dict[str, Any], fields: dict[str, str], terms: list[str]) -> bool:
    for k, want in fields.items():
        v = rec.get(k, (rec.get("extra") or {}).get(k))
        if isinstance(v, list):
            if not any(fnmatch.fnmatchcase(str(x), want) for x in v):
                return False
        elif v is None or not fnmatch.fnmatchcase(str(v), want):
            return False
    if terms:
        text = _body(rec).lower()
        return all(t.lower() in text for t in terms)
    return True


class _JsonlReader:
    def __init__(self, directory: Path) -> None:
        self.files = sorted(directory.glob("traces-*.jsonl"))

    def records(self) -> Iterator[dict[str, Any]]:
        """Newest first."""
        for path in reversed(self.files):
            with path.open(encoding="utf-8") as f:
                lines = f.readlines()
            for line in reversed(lines):
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by a crash
                    yield json.loads(line)

    def search(self, fields: dict[str, str], terms: list[str], limit: int) -> Iterator[dict]:
        n = 0
        for rec in self.records():
            if _matches(rec, fields, terms):
                yield rec
                n += 1
                if n >= limit:
                    return

    def find(self, job: str) -> list[dict]:
        return [r for r in self.records() if _is_job(r, job)]

    def summary(self) -> dict[str, Any]:
        return _summarise(self.records())

    def close(self) -> None:
        pass


def _is_job(r: dict[str, Any], job: str) -> bool:
    return r.get("trace_id") == job or (r.get("kind") == "job" and str(r.get("job")) == job)


class _SqliteReader:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def search(self, fields: dict[str, str], terms: list[str], limit: int) -> Iterator[dict]:
        where, args = [], []
        if terms:
            # each term as a phrase prefix: `ZeroDiv` finds ZeroDivisionError
            match = " AND ".join('"' + t.replace('"', '""') + '"*' for t in terms)
            where.append("id IN (SELECT rowid FROM traces_fts WHERE traces_fts MATCH ?)")
            args.append(match)
        rest = {}
        for k, v in fields.items():
            if k in _COLUMNS:
                where.append(f'CAST("{k}" AS TEXT) GLOB ?')
                args.append(v)
            else:
                rest[k] = v
        sql = "SELECT record FROM traces"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        n = 0
        for (text,) in self.db.execute(sql, args):
            rec = json.loads(text)
            # FTS matches tokens; the JSONL reader matches substrings: check as it does
            if rest and not _matches(rec, rest, []):
                continue
            yield rec
            n += 1
            if n >= limit:
                return

    def find(self, job: str) -> list[dict]:
        rows = self.db.execute(
            "SELECT record FROM traces WHERE trace_id = ? OR (kind = 'job' AND "
            "CAST(job AS TEXT) = ?) ORDER BY id",
            (job, job),
        )
        return [json.loads(t) for (t,) in rows]

    def summary(self) -> dict[str, Any]:
        return _summarise(json.loads(t) for (t,) in self.db.execute("SELECT record FROM traces"))

    def close(self) -> None:
        self.db.close()


def _summarise(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    kinds: Counter = Counter()
    status: Counter = Counter()
    lang: Counter = Counter()
    classes: Counter = Counter()
    syscalls: Counter = Counter()
    failing: Counter = Counter()
    wall = 0.0
    for r in records:
        kinds[r.get("kind", "?")] += 1
        if r.get("kind") == "job":
            status[r.get("status", "?")] += 1
            lang[r.get("language", "?")] += 1
            syscalls.update(r.get("denied_syscalls") or ())
            wall += r.get("wall_time_s") or 0.0
        elif r.get("kind") == "judgement":
            classes[r.get("error_class", "?")] += 1
            if not r.get("passed") and r.get("task_id"):
                failing[r["task_id"]] += 1
    return {
        "records": sum(kinds.values()),
        "kinds": dict(kinds),
        "jobs_by_status": dict(status.most_common()),
        "jobs_by_language": dict(lang.most_common()),
        "job_wall_time_s": wall,
        "judgements_by_error_class": dict(classes.most_common()),
        "refused_syscalls": dict(syscalls.most_common(20)),
        "most_failing_tasks": dict(failing.most_common(10)),
    }


@contextlib.contextmanager
def open_reader(directory: str | os.PathLike[str]) -> Iterator[Any]:
    """A reader of the traces in ``directory`` (SQLite if ``traces.sqlite`` is there, else
    the JSONL files); raises FileNotFoundError naming the directory if it has neither."""
    d = Path(directory)
    db = d / "traces.sqlite"
    if db.is_file():
        reader: Any = _SqliteReader(db)
    elif d.is_dir() and any(d.glob("traces-*.jsonl")):
        reader = _JsonlReader(d)
    else:
        raise FileNotFoundError(f"no traces in {d} (traces.sqlite or traces-*.jsonl)")
    try:
        yield reader
    finally:
        reader.close()
