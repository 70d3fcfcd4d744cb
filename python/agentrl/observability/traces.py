"""Execution traces: a record of every sandbox job, written off the hot path, searchable.

A :class:`Tracer` is a pool observer (``SandboxPool(tracer=...)``, ``Evaluator(tracer=...)``
or ``pool.add_observer(tracer)``). On the pool's threads it only keeps a reference to each
submitted job and, when the job ends, puts ``(outcome, job, time)`` on a bounded queue; a
background thread builds the records and hands them to the sink. When the queue is full a
record is dropped and counted (``stats()["dropped"]``): tracing never blocks the pool.

A job record carries the ids of its context (:func:`agentrl.observability.job_context`: task,
episode, group, policy version, judge), the language, a hash of the source (or command), the
verdict (status, exit code, signal, limit, times, peak memory, refused system calls), and
stdout/stderr capped at ``output_cap`` bytes each. A judge adds a ``judgement`` record (the
failing test, the error class, the traceback) sharing the jobs' ``judge`` id.

Sinks (:mod:`agentrl.observability.sinks`): rotating JSONL files (``"jsonl"``, the default) or
a SQLite store with FTS5 full-text search (``"sqlite"``). :func:`search`, :func:`show` and
:func:`summary` read a trace directory (``agentrl traces search|show|stats``).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from agentrl.observability.context import CONTEXT_FIELDS, current_context
from agentrl.observability.sinks import JsonlSink, SqliteSink, TraceSink, open_reader

__all__ = ["Tracer", "parse_query", "search", "show", "summary"]

_STOP = object()
_run_ids = itertools.count(1)


def _text(b: bytes | None, cap: int) -> tuple[str, bool]:
    """``b`` decoded, at most ``cap`` bytes of it: its head and its tail (where a traceback
    ends) around a marker of what was cut."""
    if not b:
        return "", False
    if len(b) <= cap:
        return b.decode("utf-8", "replace"), False
    head, tail = b[: cap // 2], b[len(b) - (cap - cap // 2) :]
    cut = len(b) - cap
    return f"{head.decode('utf-8', 'replace')}\n[... {cut} bytes cut ...]\n" + tail.decode(
        "utf-8", "replace"
    ), True


class Tracer:
    """Records every job of the pools it observes (and judgements) into ``directory``.

    * ``directory``: where the sink writes (created).
    * ``sink``: ``"jsonl"`` (rotating ``traces-NNNNNN.jsonl``), ``"sqlite"`` (``traces.sqlite``
      with FTS5), or a :class:`~agentrl.observability.sinks.TraceSink`.
    * ``output_cap``: bytes of stdout and of stderr kept per job: the head and the tail (where
      a traceback ends), around a marker of what was cut.
    * ``max_queue``: records waiting for the writer before new ones are dropped.
    * ``name``: this tracer's prefix of trace ids (``NAME-JOBID``); default: pid and a count.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sink: str | TraceSink = "jsonl",
        output_cap: int = 4096,
        max_queue: int = 100_000,
        name: str | None = None,
        max_bytes: int = 64 << 20,
        max_files: int = 20,
    ) -> None:
        if isinstance(output_cap, bool) or not isinstance(output_cap, int) or output_cap < 0:
            raise ValueError(f"output_cap must be a non-negative int, got {output_cap!r}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue must be a positive int, got {max_queue!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if isinstance(sink, str):
            if sink == "jsonl":
                sink = JsonlSink(self.directory, max_bytes=max_bytes, max_files=max_files)
            elif sink == "sqlite":
                sink = SqliteSink(self.directory / "traces.sqlite")
            else:
                raise ValueError(f'sink must be "jsonl", "sqlite" or a TraceSink, got {sink!r}')
        self.sink: TraceSink = sink
        self.output_cap = output_cap
        self.max_queue = max_queue
        self.name = name or f"{os.getpid()}.{next(_run_ids)}"
        self._lock = threading.Lock()
        self._jobs: dict[int, Any] = {}
        self._early: dict[int, tuple[Any, float]] = {}
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._n = {"queued": 0, "written": 0, "dropped": 0, "errors": 0}
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._write, name="agentrl-tracer", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, Tracer._stop, self._q, self._thread)

    # ---- pool observer (the pool's threads: keep it cheap)
    def submitted(self, ids: list[int], items: list) -> None:
        with self._lock:
            early = self._early
            for jid, it in zip(ids, items, strict=False):
                e = early.pop(jid, None) if early else None
                if e is None:
                    self._jobs[jid] = it
                else:
                    self._put((e[0], it, e[1]))

    def finished(self, outcomes: list) -> None:
        now = time.time()
        with self._lock:
            pop = self._jobs.pop
            for o in outcomes:
                it = pop(o[0], None)
                if it is None:  # reported before its submission, or submitted before us
                    self._early[o[0]] = (o, now)
                else:
                    self._put((o, it, now))
            if len(self._early) > 64:
                # jobs submitted before this tracer was added: recorded without their job
                for jid, (o, t) in list(self._early.items()):
                    if now - t > 1.0:
                        del self._early[jid]
                        self._put((o, None, t))

    def _put(self, entry: Any) -> None:
        if self._q.qsize() >= self.max_queue or self._closed:
            self._n["dropped"] += 1
            return
        self._n["queued"] += 1
        self._idle.clear()
        self._q.put(entry)

    # ---- judgements and free records
    def record_judgement(self, judgement: Any, context: Mapping[str, Any] | None = None) -> None:
        """Records a judge's verdict (an :class:`agentrl.evaluation.Judgement`): the error
        class, the failing test and the traceback, with ``context`` (default: the current
        :func:`job_context`)."""
        ctx = dict(context if context is not None else (current_context() or {}))
        with self._lock:
            self._put(("judgement", judgement, ctx, time.time()))

    def record(self, **fields: Any) -> None:
        """Records an arbitrary event (``kind`` defaults to ``"event"``)."""
        fields.setdefault("kind", "event")
        fields.setdefault("time", time.time())
        with self._lock:
            self._put(("raw", fields))

    # ---- the writer thread
    def _write(self) -> None:
        q = self._q
        while True:
            batch = [q.get()]
            while len(batch) < 1024:
                try:
                    batch.append(q.get_nowait())
                except queue.Empty:
                    break
            stop = any(e is _STOP for e in batch)
            recs = []
            for e in batch:
                if e is _STOP:
                    continue
                try:
                    recs.append(self._build(e))
                except Exception:
                    self._n["errors"] += 1
            if recs:
                try:
                    self.sink.write(recs)
                    self._n["written"] += len(recs)
                except Exception:
                    self._n["errors"] += len(recs)
            if stop:
                try:
                    self.sink.close()  # on this thread: a SQLite connection is bound to it
                finally:
                    self._idle.set()
                return
            if q.empty():
                self._idle.set()

    def _build(self, e: tuple) -> dict[str, Any]:
        if e[0] == "raw":
            return dict(e[1])
        if e[0] == "judgement":
            return self._judgement_record(e[1], e[2], e[3])
        o, item, t = e
        tag = getattr(item, "tag", None)
        lang, ctx = (tag if tag else ("other", None)) or ("other", None)
        rec: dict[str, Any] = {
            "kind": "job",
            "trace_id": f"{self.name}-{o[0]}",
            "job": o[0],
            "time": t,
            "language": lang,
        }
        if ctx:
            extra = {}
            for k, v in ctx.items():
                if k in CONTEXT_FIELDS:
                    rec.setdefault(k, v)
                else:
                    extra[k] = v
            if extra:
                rec["extra"] = extra
        req = getattr(item, "request", None)
        if req is not None:
            main = next((c for n, c in req.files if n == "__main__.py"), None)
            if main is None:
                src = b"\0".join(req.argv)
                rec["argv"] = [a.decode("utf-8", "replace")[:200] for a in req.argv[:16]]
            else:
                src = main.encode() if isinstance(main, str) else main
            rec["source_sha256"] = hashlib.sha256(src).hexdigest()
        rec["outcome"] = o[1].value
        r = o[2]
        if r is None or o[1].value != "completed" or not hasattr(r, "status"):
            rec["status"] = o[1].value
            if o[3]:
                rec["error"] = o[3]
            return rec
        cap = self.output_cap
        out, out_cut = _text(r.stdout, cap)
        err, err_cut = _text(r.stderr, cap)
        rec.update(
            status=r.status.value,
            exit_code=r.exit_code,
            signal=r.signal,
            limit=r.limit,
            wall_time_s=r.wall_time_s,
            cpu_time_s=r.cpu_time_s,
            peak_memory_bytes=r.peak_memory_bytes,
            denied_syscalls=list(r.denied_syscalls),
            stdout=out,
            stderr=err,
            stdout_truncated=out_cut or r.stdout_truncated,
            stderr_truncated=err_cut or r.stderr_truncated,
        )
        if r.error:
            rec["error"] = r.error
        return rec

    def _judgement_record(self, j: Any, ctx: Mapping[str, Any], t: float) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": "judgement", "time": t}
        for k, v in ctx.items():
            rec[k if k in CONTEXT_FIELDS else f"extra.{k}"] = v
        rec["task_id"] = getattr(j, "task_id", rec.get("task_id"))
        rec["trace_id"] = f"{self.name}-judge-{ctx.get('judge', id(j))}"
        rec["passed"] = bool(getattr(j, "passed", False))
        ec = getattr(j, "error_class", None)
        rec["error_class"] = getattr(ec, "value", ec)
        rec["status"] = "passed" if rec["passed"] else rec["error_class"]
        cases = getattr(j, "cases", None) or ()
        bad = next((c for c in cases if not getattr(c, "passed", True)), None)
        if bad is not None:
            rec["failing_test"] = getattr(bad, "message", "") or ""
            rec["traceback"] = getattr(bad, "traceback", "") or ""
        rec["feedback"] = (getattr(j, "feedback", "") or "")[: 4 * self.output_cap]
        rec["wall_time_s"] = getattr(j, "wall_time_s", None)
        return rec

    # ---- lifecycle
    def flush(self, timeout: float | None = 10.0) -> bool:
        """Waits until every queued record is written; false on timeout."""
        return self._idle.wait(timeout)

    def stats(self) -> dict[str, Any]:
        """Records queued (ever), written, dropped (queue full), failed to build or write, and
        jobs seen but not finished yet."""
        with self._lock:
            return {**self._n, "pending_jobs": len(self._jobs), "backlog": self._q.qsize()}

    @staticmethod
    def _stop(q: queue.SimpleQueue, thread: threading.Thread) -> None:
        q.put(_STOP)
        if thread is not threading.current_thread():
            thread.join(30)

    def close(self) -> None:
        """Writes what is queued, stops the writer and closes the sink. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- reading
_FIELD_ALIASES = {
    "task": "task_id",
    "lang": "language",
    "policy": "policy_version",
    "version": "policy_version",
    "error": "error_class",
    "class": "error_class",
    "id": "trace_id",
    "syscall": "denied_syscalls",
}


def parse_query(query: str) -> tuple[dict[str, str], list[str]]:
    """``'status:timeout task:HumanEval/32 ZeroDivisionError'`` -> (field filters, free
    terms). A field name may be an alias (``task``, ``lang``, ``policy``, ``error``,
    ``syscall``, ``id``); a value may use ``*`` wildcards."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    fields: dict[str, str] = {}
    terms: list[str] = []
    for tok in query.split():
        name, sep, value = tok.partition(":")
        if sep and name.isidentifier() and value:
            fields[_FIELD_ALIASES.get(name, name)] = value
        else:
            terms.append(tok)
    return fields, terms


def search(directory: str | os.PathLike[str], query: str, limit: int = 50) -> Iterator[dict]:
    """Records of ``directory`` matching ``query`` (see :func:`parse_query`), newest first:
    from ``traces.sqlite`` (FTS5) where it exists, else by scanning the JSONL files."""
    fields, terms = parse_query(query)
    with open_reader(directory) as reader:
        yield from reader.search(fields, terms, limit)


def show(directory: str | os.PathLike[str], job: str) -> list[dict]:
    """The records of job ``job`` (a trace id, or a pool job id), with the judgement that
    shares its judge id."""
    with open_reader(directory) as reader:
        recs = reader.find(job)
        judges = {r.get("judge") for r in recs if r.get("kind") == "job" and r.get("judge")}
        for jid in judges:
            recs += [
                r
                for r in reader.search({"judge": str(jid), "kind": "judgement"}, [], 10)
                if r not in recs
            ]
        return recs


def summary(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Counts of the records of ``directory``: by kind, status, language, error class,
    refused system call and task (the 10 most failing)."""
    with open_reader(directory) as reader:
        return reader.summary()
