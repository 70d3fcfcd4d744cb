"""Compile-and-run in many languages, and comparing outputs the way the field's judges do.

* ``specs``: :data:`LANGUAGES` (canonical name -> :class:`Language`: how it compiles and runs,
  its standard flags and why), :func:`resolve_language` (SandboxFusion's names and aliases;
  :class:`UnknownLanguage`, :class:`ToolchainMissing`).
* ``toolchain``: finding each language's programs where a box can see them (under ``/usr``).
* ``cache``: the compile cache (:class:`CompileCache`): one compile per program, however
  many cases it is judged on; concurrent compiles of one program coalesce.
* ``runner``: :func:`run_code` / :func:`arun_code` (compile in a box, run in another) and the
  halves the Evaluator uses (:func:`prepare`, :func:`submit_program`).
* ``compare``: :func:`compare_output` and :data:`COMPARE_MODES` (exact, whitespace, float,
  SandboxFusion's, CodeContests' and LiveCodeBench's rules).

See docs/languages.md.
"""

from agentrl.languages.cache import CompileCache, Compiled, default_cache
from agentrl.languages.compare import COMPARE_MODES, compare_output, normalize_mode
from agentrl.languages.errors import ToolchainMissing, UnknownLanguage
from agentrl.languages.runner import (
    CodeRun,
    Program,
    aprepare,
    arun_code,
    prepare,
    run_code,
    start_program,
    submit_program,
)
from agentrl.languages.specs import LANGUAGES, Language, canonical_name, resolve_language

__all__ = [
    "COMPARE_MODES",
    "LANGUAGES",
    "CodeRun",
    "CompileCache",
    "Compiled",
    "Language",
    "Program",
    "ToolchainMissing",
    "UnknownLanguage",
    "aprepare",
    "arun_code",
    "canonical_name",
    "compare_output",
    "default_cache",
    "normalize_mode",
    "prepare",
    "resolve_language",
    "run_code",
    "start_program",
    "submit_program",
]
