"""``agentrl traces search|show|stats``: the execution traces a run recorded.

``search QUERY...``: free text (``ZeroDivisionError``) and field filters (``status:timeout
task:HumanEval/32 lang:python kind:judgement syscall:socket``, ``*`` wildcards), all of which
must match; newest first. ``show JOB``: a job's record (trace id or pool job id) with its
judgement and full captured output. ``stats``: counts by verdict, language, error class,
refused system call, and the most failing tasks. ``--traces DIR`` (default ``$AGENTRL_TRACES``
or ``./traces``): the directory a :class:`~agentrl.observability.traces.Tracer` wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``traces`` subcommand."""
    p = subparsers.add_parser(
        "traces",
        help="search and show the execution traces of sandbox jobs",
        description="Search, show and count the trace records of sandbox jobs and judgements.",
    )
    sub = p.add_subparsers(dest="traces_command", required=True)
    default = os.environ.get("AGENTRL_TRACES", "traces")
    s = sub.add_parser("search", help="records matching free text and field:value filters")
    s.add_argument("query", nargs="+", help="words and field:value filters (all must match)")
    s.add_argument("--limit", type=int, default=20, help="most records shown")
    s.add_argument("--json", action="store_true", help="one JSON record a line")
    w = sub.add_parser("show", help="one job's records, output and judgement")
    w.add_argument("job", help="trace id (NAME-JOBID) or pool job id")
    w.add_argument("--json", action="store_true", help="the records as JSON")
    st = sub.add_parser("stats", help="counts by verdict, language, error class, syscall")
    for q in (s, w, st):
        q.add_argument("--traces", metavar="DIR", default=default, help="the trace directory")
    p.set_defaults(func=run)
    return p


def _line(r: dict[str, Any]) -> str:
    t = time.strftime("%H:%M:%S", time.localtime(r.get("time") or 0))
    head = f"{t} {r.get('trace_id', '?'):<18} {r.get('kind', '?'):<9} {r.get('status', '?'):<13}"
    bits = [f"task={r['task_id']}" for _ in (0,) if r.get("task_id")]
    for k in ("language", "episode", "policy_version", "limit"):
        if r.get(k) not in (None, ""):
            bits.append(f"{k}={r[k]}")
    text = r.get("traceback") or r.get("stderr") or r.get("error") or r.get("stdout") or ""
    last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
    if last:
        bits.append("| " + last.strip()[:100])
    return head + " " + " ".join(bits)


def run(args: argparse.Namespace) -> int:
    from agentrl.observability import traces

    try:
        if args.traces_command == "search":
            if args.limit < 1:
                print("agentrl traces: --limit must be positive", file=sys.stderr)
                return 2
            found = list(traces.search(args.traces, " ".join(args.query), args.limit))
            for r in found:
                print(json.dumps(r) if args.json else _line(r))
            if not found:
                print("no matching records", file=sys.stderr)
                return 1
        elif args.traces_command == "show":
            recs = traces.show(args.traces, args.job)
            if not recs:
                print(f"agentrl traces: no job {args.job!r} in {args.traces}", file=sys.stderr)
                return 1
            for r in recs:
                if args.json:
                    print(json.dumps(r))
                    continue
                print(_line(r))
                for k, v in r.items():
                    if k in ("stdout", "stderr", "traceback", "feedback", "failing_test"):
                        continue
                    print(f"  {k}: {v}")
                for k in ("failing_test", "traceback", "stdout", "stderr", "feedback"):
                    if r.get(k):
                        print(f"  --- {k}\n" + "\n".join("  " + x for x in r[k].splitlines()))
        else:
            print(json.dumps(traces.summary(args.traces), indent=2))
    except FileNotFoundError as e:
        print(f"agentrl traces: {e}", file=sys.stderr)
        return 2
    except (sqlite3_error(), ValueError) as e:
        print(f"agentrl traces: {e}", file=sys.stderr)
        return 2
    return 0


def sqlite3_error() -> type[Exception]:
    import sqlite3

    return sqlite3.Error
