"""The languages: how each is compiled and run, with which flags and why.

:data:`LANGUAGES` maps each canonical name to its :class:`Language`; :func:`resolve_language`
also takes SandboxFusion's names (``python``, ``cpp``, ``nodejs``, ``go``, ``java``,
``typescript``, ``rust``, ``bash``, ... from ``sandbox/runners/types.py`` of
bytedance/SandboxFusion) and common aliases (``c++``, ``js``, ``py``, ``sh``), and raises
:class:`UnknownLanguage` or :class:`ToolchainMissing`.

An argv template names a tool as ``@name`` (its real path on the host, the same in a box),
the source file as ``{src}``, the compile's artifact as ``{out}`` and Java's main class as
``{main}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from agentrl.languages.errors import ToolchainMissing, UnknownLanguage
from agentrl.languages.toolchain import Toolchain, find_toolchain
from agentrl.sandbox.limits import Limits

__all__ = ["LANGUAGES", "Language", "canonical_name", "resolve_language"]

COMPILE_LIMITS = Limits(
    wall_time_s=10.0,
    cpu_time_s=10.0,
    memory_bytes=1 << 30,
    max_pids=64,
    max_output_bytes=1 << 20,
    max_file_bytes=64 << 20,
    max_open_files=256,
    tmpfs_bytes=256 << 20,
)
"""Default limits of a compile: SandboxFusion's default ``compile_timeout`` (10 s) as wall and
CPU time; 1 GiB of memory (g++ on ``<bits/stdc++.h>`` peaks near 250 MiB, javac's JVM sizes
its heap from the limit); 64 processes and threads (the driver, cc1plus, as, collect2, ld; the
JVM's threads); a 64 MiB cap on the artifact; 256 MiB of tmpfs for temporaries."""


@dataclass(frozen=True)
class Language:
    """How one language is compiled (if at all) and run in a box."""

    name: str
    """Canonical name (SandboxFusion's where it has one)."""
    title: str
    """Human name."""
    source: str
    """File the code is written to in the box (Java: ``{main}.java``)."""
    tools: tuple[str, ...]
    """Host programs it needs; empty for Python (run by the executor's own interpreter)."""
    run: tuple[str, ...]
    """argv template of a run. For a native artifact (``native``): the program itself."""
    compile: tuple[str, ...] | None = None
    """argv template of the compile step; ``None`` for an interpreted language."""
    artifact: str | None = None
    """What the compile step leaves in the work dir for the runs (collected from its box)."""
    native: bool = False
    """The artifact is a native executable (run through its ELF interpreter, see ``runner``)."""
    flags: tuple[str, ...] = ()
    """The standard flags, as written in ``compile``/``run`` (for docs and reports)."""
    why: str = ""
    """Why these flags."""
    aliases: tuple[str, ...] = ()
    """Other names it answers to (lower case)."""
    extra_dirs: tuple[str, ...] = ()
    """More directories (globs) to look for ``tools`` in, after the usual bin directories."""
    siblings: bool = False
    """Take the other tools from the first one's directory (one JDK's javac, jar and java)."""
    compile_limits: Limits = COMPILE_LIMITS
    """Default limits of the compile step."""
    compile_env: tuple[tuple[str, str], ...] = ()
    """Environment of the compile step."""
    run_env: tuple[tuple[str, str], ...] = ()
    """Environment of each run."""
    version_args: tuple[str, ...] = ("--version",)
    """How the first tool tells its version."""
    main_class: bool = False
    """The source file is named after its public class (Java)."""
    support_files: tuple[tuple[str, str], ...] = ()
    """Files agentrl adds to the compile's box (name, text), e.g. TypeScript's declarations of
    Node's globals; named in ``compile``, part of the cache key, and they win a name clash
    with the caller's ``files`` (the source still wins over them)."""

    @property
    def compiled(self) -> bool:
        """Whether the language has a compile step."""
        return self.compile is not None

    @property
    def python(self) -> bool:
        """Run by the executor's ``submit_python`` / ``run_python`` (the warm interpreter)."""
        return self.name == "python"

    def toolchain(self) -> Toolchain:
        """Its tools as found on this host (cached)."""
        return find_toolchain(self.tools, self.extra_dirs, self.siblings)

    @property
    def available(self) -> bool:
        """Whether this host has every tool it needs."""
        return self.toolchain().ok

    def version(self) -> str:
        """The first tool's version line (runs it once on the host), or ``"missing"``."""
        if self.python:
            import sys

            return f"Python {sys.version.split()[0]} (the executor's interpreter)"
        tc = self.toolchain()
        return tc.version(self.tools[0], self.version_args) if tc.ok else "missing"

    def source_name(self, code: str) -> tuple[str, str]:
        """``(file name, main class)`` for ``code`` (the class only matters to Java)."""
        main = java_main_class(code) if self.main_class else "Main"
        return self.source.replace("{main}", main), main


_PUBLIC_CLASS = re.compile(
    r"^\s*public\s+(?:(?:final|abstract|strictfp)\s+)*(?:class|enum|record|interface)\s+"
    r"([A-Za-z_][A-Za-z0-9_]*)",
    re.M,
)


def java_main_class(code: str) -> str:
    """The top-level public class of Java ``code`` (javac requires the file to carry its
    name), else ``Main`` (SandboxFusion writes ``Main.java`` and runs ``Main``)."""
    m = _PUBLIC_CLASS.search(code)
    return m.group(1) if m else "Main"


_NATIVE = ("{exe}",)

NODE_GLOBALS_DTS = """\
// agentrl: Node's globals for tsc (no @types/node on the host), all typed `any`, and every
// module (`import ... from "fs"`) as `any`: code written for tsx or ts-node type-checks.
declare var console: any, process: any, require: any, module: any, exports: any, Buffer: any;
declare var global: any, __filename: string, __dirname: string;
declare var setTimeout: any, clearTimeout: any, setInterval: any, clearInterval: any;
declare var setImmediate: any, clearImmediate: any, queueMicrotask: any, structuredClone: any;
declare var TextEncoder: any, TextDecoder: any, URL: any, URLSearchParams: any, performance: any;
declare module "*";
"""
"""TypeScript's ambient declarations (``agentrl-node.d.ts`` in the compile's box): with
``--lib es2020`` (no DOM library, which costs tsc about half of its time), what Node gives a
program. A program may redeclare them as ``declare var require: any;``."""

_SPECS = (
    Language(
        name="python",
        title="Python 3",
        source="__main__.py",
        tools=(),
        run=(),
        aliases=("python3", "py", "py3"),
        why="Runs as /work/__main__.py in a fork of the executor's warm interpreter "
        "(Sandbox.run_python): the same verdict as `python3 main.py`, without its start-up.",
    ),
    Language(
        name="c",
        title="C (GCC)",
        source="main.c",
        tools=("gcc",),
        compile=("@gcc", "-std=gnu17", "-O2", "-pipe", "-o", "{out}", "{src}", "-lm"),
        artifact="main",
        native=True,
        run=_NATIVE,
        flags=("-std=gnu17", "-O2", "-pipe", "-lm"),
        why="gnu17: C17 with the GNU extensions contest code relies on; -O2: the level judges "
        "(Codeforces, AtCoder, ICPC) use, so a solution's speed matches what its limits "
        "assume; -pipe: no temporary files in the box's tmpfs; -lm: math.h functions link.",
        aliases=("gcc", "c11", "c17"),
    ),
    Language(
        name="cpp",
        title="C++ (GCC)",
        source="main.cpp",
        tools=("g++",),
        compile=("@g++", "-std=c++17", "-O2", "-pipe", "-o", "{out}", "{src}"),
        artifact="main",
        native=True,
        run=_NATIVE,
        flags=("-std=c++17", "-O2", "-pipe"),
        why="c++17: what SandboxFusion compiles with (`g++ -std=c++17`) and what most contest "
        "data assumes; -O2: the judges' level (an -O0 build of STL-heavy code runs several "
        "times slower than the time limits assume); -pipe: no temporaries in the tmpfs.",
        aliases=("c++", "cxx", "cc", "g++", "cpp17", "c++17"),
    ),
    Language(
        name="java",
        title="Java (OpenJDK)",
        source="{main}.java",
        tools=("javac", "jar", "java", "sh"),
        compile=(
            "@sh",
            "-c",
            '"$0" -J-XX:+UseSerialGC -J-XX:TieredStopAtLevel=1 -encoding UTF-8 -d classes "$2"'
            ' && "$1" cf main.jar -C classes .',
            "@javac",
            "@jar",
            "{src}",
        ),
        artifact="main.jar",
        run=(
            "@java",
            "-XX:+UseSerialGC",
            "-XX:MaxRAMPercentage=75",
            "-Xss64m",
            "-ea",
            "-cp",
            "main.jar",
            "{main}",
        ),
        flags=("-encoding UTF-8", "-XX:+UseSerialGC", "-XX:MaxRAMPercentage=75", "-Xss64m", "-ea"),
        why="The classes (inner ones too) go into one jar, the one artifact each run gets. "
        "javac runs with the C1 compiler only (TieredStopAtLevel=1: a short-lived javac "
        "starts about 35% faster). SerialGC: one GC thread, so a run's threads and CPU time "
        "do not grow with the host's cores; MaxRAMPercentage=75: the heap may use most of the "
        "box's memory limit (the JVM reads it from the box's cgroup) instead of a quarter; "
        "-Xss64m: deep recursion, as judges allow; -ea: assertions on, as SandboxFusion runs "
        "Java. The source is named after its public class (default Main).",
        aliases=("java17", "jdk"),
        extra_dirs=("/usr/lib/jvm/default-java/bin", "/usr/lib/jvm/*/bin"),
        siblings=True,
        compile_env=(("HOME", "/tmp"),),
        version_args=("-version",),
        main_class=True,
    ),
    Language(
        name="nodejs",
        title="JavaScript (Node.js)",
        source="main.js",
        tools=("node",),
        run=("@node", "{src}"),
        why="`node main.js`, as SandboxFusion runs it (no flags).",
        aliases=("javascript", "js", "node", "node.js"),
        run_env=(("HOME", "/tmp"),),
    ),
    Language(
        name="typescript",
        title="TypeScript (tsc, then Node.js)",
        source="main.ts",
        tools=("tsc", "node", "sh"),
        compile=(
            "@sh",
            "-c",
            '"$0" "$@" >&2',  # tsc prints its diagnostics on stdout: they belong on stderr
            "@tsc",
            "--target",
            "ES2020",
            "--module",
            "commonjs",
            "--outDir",
            ".",
            "--lib",
            "es2020",
            "--noEmitOnError",
            "--skipLibCheck",
            "{src}",
            "agentrl-node.d.ts",
        ),
        artifact="main.js",
        run=("@node", "{out}"),
        flags=(
            "--target ES2020",
            "--module commonjs",
            "--lib es2020",
            "--noEmitOnError",
            "--skipLibCheck",
        ),
        why="Compiled once by tsc to CommonJS (what `node main.js` runs), ES2020 output for "
        "Node 14+; a type error is a compile error (--noEmitOnError). SandboxFusion runs tsx, "
        "which skips type checking: code that is wrong only in its types fails here. tsc "
        "writes its diagnostics to stdout; the compile moves them to stderr, where every "
        "compiler's are (SandboxFusion's compile_result.stderr). --lib es2020 with "
        "agentrl-node.d.ts (Node's globals and modules as `any`) instead of the default DOM "
        "library: tsc's CPU time halves (2.0 s to 1.1 s for a small program) and code that "
        "uses require, process or `import ... from 'fs'` without @types/node compiles.",
        support_files=(("agentrl-node.d.ts", NODE_GLOBALS_DTS),),
        aliases=("ts", "tsc"),
        compile_env=(("HOME", "/tmp"),),
        run_env=(("HOME", "/tmp"),),
    ),
    Language(
        name="go",
        title="Go",
        source="main.go",
        tools=("go",),
        compile=("@go", "build", "-o", "{out}", "{src}"),
        artifact="main",
        native=True,
        run=_NATIVE,
        flags=("GO111MODULE=off", "GOTOOLCHAIN=local", "GOMAXPROCS=4"),
        why="`go build -o main main.go` as SandboxFusion builds it, against the distribution's "
        "precompiled standard library (under GOROOT, /usr/lib/go-*, read-only): no flag that "
        "changes the std's build IDs (-trimpath, CGO_ENABLED=0 rebuild it, 25 s for fmt), so "
        "a compile takes about 0.5 s with an empty build cache. The build cache and GOPATH are "
        "in the compile box's own /tmp (HOME is not writable), fresh per compile: the compile "
        "cache keeps the artifact, and no box sees another's objects. GO111MODULE=off: one "
        "file, no go.mod, no module download; GOTOOLCHAIN=local: never a toolchain download. "
        "GOMAXPROCS=4 in the compile and the runs: threads (and the go command's parallel "
        "jobs) do not grow with the host's cores, so the process limits hold on a large host.",
        aliases=("golang",),
        extra_dirs=("/usr/lib/go/bin", "/usr/local/go/bin", "/usr/lib/go-*/bin"),
        compile_limits=COMPILE_LIMITS.replace(max_pids=128),
        compile_env=(
            ("HOME", "/tmp"),
            ("GOCACHE", "/tmp/go-cache"),
            ("GOPATH", "/tmp/go"),
            ("GO111MODULE", "off"),
            ("GOTOOLCHAIN", "local"),
            ("GOMAXPROCS", "4"),
        ),
        run_env=(("GOMAXPROCS", "4"),),
        version_args=("version",),
    ),
    Language(
        name="rust",
        title="Rust",
        source="main.rs",
        tools=("rustc",),
        compile=("@rustc", "--edition", "2021", "-O", "-o", "{out}", "{src}"),
        artifact="main",
        native=True,
        run=_NATIVE,
        flags=("--edition 2021", "-O"),
        why="Edition 2021 (SandboxFusion's bare `rustc` means edition 2015, where much of "
        "today's code does not compile); -O: the judges' optimised build.",
        aliases=("rs", "rustc"),
        compile_env=(("HOME", "/tmp"),),
    ),
    Language(
        name="bash",
        title="Bash",
        source="main.sh",
        tools=("bash",),
        run=("@bash", "{src}"),
        why="`bash main.sh`, as SandboxFusion runs it.",
        aliases=("sh", "shell"),
    ),
    Language(
        name="perl",
        title="Perl 5",
        source="main.pl",
        tools=("perl",),
        run=("@perl", "{src}"),
        why="`perl main.pl`.",
        aliases=("pl",),
    ),
    Language(
        name="php",
        title="PHP",
        source="main.php",
        tools=("php",),
        run=("@php", "-f", "{src}"),
        why="`php -f main.php`, as SandboxFusion runs it.",
    ),
    Language(
        name="ruby",
        title="Ruby",
        source="main.rb",
        tools=("ruby",),
        run=("@ruby", "{src}"),
        why="`ruby main.rb`.",
        aliases=("rb",),
    ),
    Language(
        name="lua",
        title="Lua",
        source="main.lua",
        tools=("lua",),
        run=("@lua", "{src}"),
        why="`lua main.lua`.",
    ),
    Language(
        name="R",
        title="R",
        source="main.R",
        tools=("Rscript",),
        run=("@Rscript", "{src}"),
        why="`Rscript main.R`.",
        aliases=("r", "rscript"),
    ),
    Language(
        name="julia",
        title="Julia",
        source="main.jl",
        tools=("julia",),
        run=("@julia", "{src}"),
        why="`julia main.jl`.",
        aliases=("jl",),
        run_env=(("HOME", "/tmp"), ("JULIA_DEPOT_PATH", "/tmp/julia")),
    ),
)

LANGUAGES: Mapping[str, Language] = MappingProxyType({lang.name: lang for lang in _SPECS})
"""Every language agentrl knows, by canonical name (whether or not this host can run it:
:attr:`Language.available`)."""

_BY_NAME: dict[str, str] = {}
for _lang in _SPECS:
    for _n in (_lang.name, *_lang.aliases):
        _BY_NAME[_n.lower()] = _lang.name


def canonical_name(name: str) -> str:
    """The canonical name of ``name`` (case-insensitive, aliases too); no toolchain check.
    Raises :class:`UnknownLanguage`."""
    if not isinstance(name, str):
        raise TypeError(f"language must be a str, got {type(name).__name__}")
    canon = _BY_NAME.get(name.strip().lower())
    if canon is None:
        raise UnknownLanguage(name, LANGUAGES)
    return canon


def resolve_language(name: str) -> Language:
    """The :class:`Language` called ``name``, checked usable on this host.

    Raises :class:`UnknownLanguage` (a ``ValueError``) for a name nobody knows and
    :class:`ToolchainMissing` (an :class:`~agentrl.AgentRLError`) naming the programs this
    host lacks."""
    lang = LANGUAGES[canonical_name(name)]
    tc = lang.toolchain()
    if not tc.ok:
        raise ToolchainMissing(lang.name, tc.missing, tc.detail)
    return lang
