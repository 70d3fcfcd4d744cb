"""Where an interpreter's installation appears in a box: bound at its own path, or (for one
under a path the box builds itself, such as a virtualenv in /tmp) relocated under
``/.agentrl/py``. Both backends, the pool and the evaluator use it to run the same program.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.sandbox.args import RELOCATED, interpreter_paths, to_box_path

__all__ = ["InterpreterLayout", "interpreter_layout", "relocate_argv0"]


# Paths the box builds for itself: an interpreter installed under one of them (a virtualenv in
# /tmp, say) is bound at a path of its own under /.agentrl/py instead, and run from there.
_BOX_OWNED = ("/tmp", "/work", "/dev", "/proc", "/sys", "/etc", "/.run", "/.agentrl")


def _box_owned(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in _BOX_OWNED)


@dataclass(frozen=True)
class InterpreterLayout:
    system_paths: list[str]
    """Bound read-only at the same path."""
    binds: list[tuple[str, str, bool]]
    """Relocated installations: (host path, box path, writable)."""
    python: str
    """The interpreter's path inside the box."""
    path_dirs: list[str]
    """Directories to put first on the box's PATH."""


def interpreter_layout(python: str) -> InterpreterLayout:
    paths = interpreter_paths()
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if prefix not in paths:
        paths.append(prefix)
    system: list[str] = []
    mapping: dict[str, str] = {}
    for p in paths:
        if _box_owned(p):
            if not any(p == m or p.startswith(m + "/") for m in mapping):
                mapping[p] = f"{RELOCATED}/{len(mapping)}"
        else:
            system.append(p)

    def to_box(path: str) -> str:
        return to_box_path(path, mapping.items())

    dirs = []
    for d in (os.path.dirname(python), os.path.dirname(os.path.realpath(python))):
        if to_box(d) not in dirs:
            dirs.append(to_box(d))
    return InterpreterLayout(
        system_paths=system,
        binds=[(src, dst, False) for src, dst in mapping.items()],
        python=to_box(python),
        path_dirs=dirs,
    )


def relocate_argv0(args: list[bytes], binds: Sequence[tuple[str, str, bool]]) -> None:
    """A host path of a relocated installation as ``argv[0]`` (``sys.executable`` of a venv
    under /work or /tmp, say) becomes the path where the box sees it: the same program."""
    args[0] = os.fsencode(to_box_path(os.fsdecode(args[0]), ((s, d) for s, d, _ in binds)))
