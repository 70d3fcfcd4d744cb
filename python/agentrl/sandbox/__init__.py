"""The sandbox: one box per run, built by the Rust core (``agentrl._core``).

* ``box``: :class:`Sandbox`, the facade (``backend="native"`` or ``"nsjail"``), and its native
  backend over the Rust core.
* ``limits``, ``result``, ``session``: a run's :class:`Limits`, its :class:`ExecResult` and
  :class:`Status`, and :class:`Session` / :class:`Snapshot` (a work dir kept across runs).
* ``args``: the argument checks every entry point shares (both backends, the pool, the envs).
* ``layout``: where an interpreter's installation appears in a box.
* ``warm``: the warm interpreter's bootstrap (the process that forks each warm run; its Rust
  side is ``agentrl_sandbox::warm``).
* ``closing``: boxes and pools still open at interpreter exit are closed.
* ``rootless``: ``agentrl rootless``, boxes without root (subordinate ids, a delegated cgroup).
"""

from agentrl.sandbox.args import Bind
from agentrl.sandbox.box import Sandbox
from agentrl.sandbox.limits import Limits, parse_duration, parse_size
from agentrl.sandbox.result import ExecResult, Status
from agentrl.sandbox.session import Session, Snapshot

__all__ = [
    "Bind",
    "ExecResult",
    "Limits",
    "Sandbox",
    "Session",
    "Snapshot",
    "Status",
    "parse_duration",
    "parse_size",
]
