"""How choosing a language fails: a name nobody knows, or a toolchain this host lacks."""

from __future__ import annotations

from collections.abc import Iterable

from agentrl.errors import AgentRLError

__all__ = ["ToolchainMissing", "UnknownLanguage"]


class UnknownLanguage(ValueError):
    """``language`` is no language agentrl knows (by canonical name or alias).

    ``known`` lists the canonical names (SandboxFusion's ``/run_code`` answers it with HTTP 422).
    """

    def __init__(self, language: str, known: Iterable[str]) -> None:
        self.language = language
        self.known = tuple(known)
        super().__init__(
            f"unknown language {language!r}; known: {', '.join(self.known)} "
            "(and their aliases, e.g. c++, js, py, sh)"
        )


class ToolchainMissing(AgentRLError):
    """The language is known, but this host lacks what it needs to compile or run it.

    ``missing`` names the programs not found (``("go",)``); ``detail`` says where they were
    looked for, or why one that exists cannot be used (a box sees only ``/usr``)."""

    def __init__(self, language: str, missing: Iterable[str], detail: str = "") -> None:
        self.language = language
        self.missing = tuple(missing)
        self.detail = detail
        msg = f"language {language!r} needs {', '.join(self.missing)}, not found on this host"
        super().__init__(msg + (f": {detail}" if detail else ""))

    def __reduce__(self):  # picklable (Ray, multiprocessing) with its fields
        return (type(self), (self.language, self.missing, self.detail))
