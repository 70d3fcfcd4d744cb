"""agentrl.languages on real sandboxes: each language's verdicts (ok, wrong answer, time-out,
compile error, runtime error), the compile cache (one compile per program, coalescing),
hostile programs and compiles (the host checked afterwards), toolchain and name errors, and
the Evaluator's stdin/stdout tasks in compiled languages."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest
from agentrl import ExecResult, Limits, SandboxPool, Status
from agentrl.evaluation import ErrorClass, Evaluator, IOCase, IOTask, task_from_dict
from agentrl.languages import (
    LANGUAGES,
    CodeRun,
    CompileCache,
    Compiled,
    ToolchainMissing,
    UnknownLanguage,
    arun_code,
    canonical_name,
    resolve_language,
    run_code,
)
from agentrl.languages import toolchain as toolchain_mod
from agentrl.languages.runner import elf_interpreter, native_argv
from conftest import (
    BOX_UID_BASE,
    BOX_UID_RANGE,
    SESSION_MARK,
    TIME_SCALE,
    assert_host_clean,
    tmp_entries,
)

RUN = Limits(
    wall_time_s=1.5 * TIME_SCALE,
    cpu_time_s=1.5 * TIME_SCALE,
    memory_bytes=512 << 20,
    max_pids=64,
    max_output_bytes=64 << 10,
)

# One program per language whose behaviour stdin picks: `add A B` prints A+B, `loop` spins
# forever, anything else exits with status 3. One compile serves every verdict.
PROGRAMS = {
    "python": (
        "import sys\n"
        "w = sys.stdin.read().split()\n"
        "if w[0] == 'add':\n    print(int(w[1]) + int(w[2]))\n"
        "elif w[0] == 'loop':\n    while True: pass\n"
        "else:\n    sys.exit(3)\n"
    ),
    "c": (
        "#include <stdio.h>\n#include <string.h>\n"
        'int main(void){char c[16]; long a,b; if(scanf("%15s",c)!=1) return 4;\n'
        ' if(!strcmp(c,"add")){scanf("%ld %ld",&a,&b); printf("%ld\\n",a+b); return 0;}\n'
        ' if(!strcmp(c,"loop")){volatile long x=0; for(;;) x++;}\n'
        " return 3;}\n"
    ),
    "cpp": (
        "#include <iostream>\n#include <string>\n"
        "int main(){std::string c; long a,b; std::cin>>c;\n"
        " if(c==\"add\"){std::cin>>a>>b; std::cout<<a+b<<'\\n'; return 0;}\n"
        ' if(c=="loop"){volatile long x=0; for(;;) x++;}\n'
        " return 3;}\n"
    ),
    "java": (
        "import java.util.*;\n"
        "public class Solution { public static void main(String[] args) {\n"
        " Scanner s = new Scanner(System.in); String c = s.next();\n"
        ' if (c.equals("add")) { System.out.println(s.nextLong() + s.nextLong()); return; }\n'
        ' if (c.equals("loop")) { long x = 0; while (true) x++; }\n'
        " System.exit(3); } }\n"
    ),
    "nodejs": (
        "const w = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/);\n"
        "if (w[0] === 'add') console.log(Number(w[1]) + Number(w[2]));\n"
        "else if (w[0] === 'loop') { for (;;) {} }\n"
        "else process.exit(3);\n"
    ),
    "go": (
        'package main\nimport (\n\t"fmt"\n\t"os"\n)\n'
        "func main() { var c string; var a, b int64; fmt.Scan(&c)\n"
        ' if c == "add" { fmt.Scan(&a, &b); fmt.Println(a + b); return }\n'
        ' if c == "loop" { for {} }\n'
        " os.Exit(3) }\n"
    ),
    "rust": (
        "use std::io::Read;\n"
        "fn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();\n"
        " let w: Vec<&str> = s.split_whitespace().collect();\n"
        ' if w[0] == "add" { let a: i64 = w[1].parse().unwrap(); let b: i64 = w[2].parse().unwrap();\n'
        '  println!("{}", a + b); return; }\n'
        ' if w[0] == "loop" { loop {} }\n'
        " std::process::exit(3); }\n"
    ),
    "typescript": (
        # as written for tsx: no declarations (agentrl-node.d.ts declares Node's globals)
        'import * as fs from "fs";\n'
        "const w: string[] = fs.readFileSync(0, 'utf8').trim().split(/\\s+/);\n"
        "if (w[0] === 'add') console.log(Number(w[1]) + Number(w[2]));\n"
        "else if (w[0] === 'loop') { for (;;) {} }\n"
        "else process.exit(3);\n"
    ),
    "bash": (
        "read c a b\n"
        "case $c in add) echo $((a + b));; loop) while :; do :; done;; *) exit 3;; esac\n"
    ),
    "perl": (
        "my @w = split ' ', join('', <STDIN>);\n"
        "if ($w[0] eq 'add') { print $w[1] + $w[2], \"\\n\"; }\n"
        "elsif ($w[0] eq 'loop') { 1 while 1; }\n"
        "else { exit 3; }\n"
    ),
}

BROKEN = {
    "python": "def f(:\n",
    "c": "int main( {\n",
    "cpp": "int main() { return undeclared; }\n",
    "java": "public class Main { void f( }\n",
    "nodejs": "function (\n",
    "go": "package main\nfunc main() { undefined() }\n",
    "rust": 'fn main() { let x: i32 = "s"; }\n',
    "typescript": "const x: number = 'not a number';\n",
    "bash": "if then fi\n",
    "perl": "sub {\n",
}

HERE = [name for name in PROGRAMS if LANGUAGES[name].available]


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    sandbox = {"env": {"AGENTRL_TEST_MARK": SESSION_MARK}, "max_concurrency": 4}
    with SandboxPool(workers=4, limits=RUN, sandbox=sandbox) as p:
        yield p


def _left_in_tmp(before: set[str]) -> set[str]:
    """New entries of the host's /tmp that a box or agentrl could have left: owned by a box
    uid, or named agentrl* (other programs on this host make temporary dirs there too)."""
    left = set()
    for name in tmp_entries() - before:
        try:
            uid = os.lstat(os.path.join("/tmp", name)).st_uid
        except OSError:
            continue
        if BOX_UID_BASE <= uid < BOX_UID_BASE + BOX_UID_RANGE or "agentrl" in name:
            left.add(name)
    return left


@pytest.fixture
def clean_host() -> Iterator[None]:
    """No box process before or after, and no file of a box left in /tmp."""
    before = tmp_entries()
    assert_host_clean()
    yield
    assert_host_clean(timeout=5.0)
    assert not _left_in_tmp(before), f"files left in /tmp: {_left_in_tmp(before)}"


# --- every language ---------------------------------------------------------------------------


@pytest.mark.parametrize("language", HERE)
def test_language_verdicts(pool: SandboxPool, language: str, clean_host: None) -> None:
    lang = LANGUAGES[language]
    cache = CompileCache()
    code = PROGRAMS[language]

    ok = run_code(pool, language, code, stdin="add 2 40\n", run_limits=RUN, cache=cache)
    assert isinstance(ok, CodeRun) and ok.language == language
    assert ok.run is not None and ok.run.status is Status.OK, ok
    assert ok.run.stdout == b"42\n"
    # A wrong answer is a correct run whose output the comparison rejects.
    assert ok.run.stdout != b"43\n"
    if lang.compiled:
        assert ok.compile is not None and ok.compile.status is Status.OK
        assert not ok.compile_cached and not ok.compile.files  # the artifact is not echoed
    else:
        assert ok.compile is None

    fail = run_code(pool, language, code, stdin="boom\n", run_limits=RUN, cache=cache)
    assert fail.run is not None and fail.run.status is Status.RUNTIME_ERROR
    assert fail.run.exit_code == 3, fail.run.summary()

    short = RUN.replace(wall_time_s=1.0 * TIME_SCALE, cpu_time_s=1.0 * TIME_SCALE)
    slow = run_code(pool, language, code, stdin="loop\n", run_limits=short, cache=cache)
    assert slow.run is not None and slow.run.status is Status.TIMEOUT, slow.run.summary()

    if lang.compiled:  # the three runs above compiled once
        assert fail.compile_cached and slow.compile_cached
        assert fail.compile == ok.compile
        assert cache.stats()["misses"] == 1 and cache.stats()["hits"] == 2

    bad = run_code(pool, language, BROKEN[language], run_limits=RUN, cache=cache)
    if lang.compiled:
        assert bad.run is None and bad.compile is not None
        assert bad.compile.status is Status.RUNTIME_ERROR and bad.compile.stderr
        assert not bad.ok
    else:  # an interpreter reports a syntax error when it runs
        assert bad.run is not None and bad.run.status is Status.RUNTIME_ERROR
        assert bad.run.stderr


def test_asyncio_path_and_coalescing(pool: SandboxPool, clean_host: None) -> None:
    cache = CompileCache()

    async def main() -> list[CodeRun]:
        return await asyncio.gather(
            *(
                arun_code(pool, "c", PROGRAMS["c"], stdin=f"add {i} 1", cache=cache)
                for i in range(6)
            )
        )

    runs = asyncio.run(main())
    assert [r.run.stdout for r in runs if r.run] == [f"{i + 1}\n".encode() for i in range(6)]
    s = cache.stats()
    assert s["misses"] == 1 and s["hits"] + s["coalesced"] == 5 and s["inflight"] == 0
    assert sum(not r.compile_cached for r in runs) == 1


def test_threads_coalesce_on_one_compile(pool: SandboxPool, clean_host: None) -> None:
    cache = CompileCache()
    out: list[CodeRun] = []
    barrier = threading.Barrier(6)

    def go(i: int) -> None:
        barrier.wait()
        out.append(run_code(pool, "cpp", PROGRAMS["cpp"], stdin=f"add {i} {i}", cache=cache))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.run.stdout for r in out if r.run) == sorted(
        f"{2 * i}\n".encode() for i in range(6)
    )
    s = cache.stats()
    assert s["misses"] == 1 and s["hits"] + s["coalesced"] == 5


def test_files_headers_and_fetch_files(pool: SandboxPool, clean_host: None) -> None:
    cache = CompileCache()
    code = '#include "lib.h"\n#include <stdio.h>\nint main(void){FILE*f=fopen("out.txt","w");'
    code += 'fprintf(f,"%d",VALUE);fclose(f);printf("%d\\n",VALUE);return 0;}\n'
    r1 = run_code(
        pool, "c", code, files={"lib.h": b"#define VALUE 7\n"}, fetch_files=["out.txt"], cache=cache
    )
    assert r1.run and r1.run.stdout == b"7\n" and r1.files == {"out.txt": b"7"}
    # Another header is another program: the cache key covers the compile's files.
    r2 = run_code(pool, "c", code, files={"lib.h": b"#define VALUE 8\n"}, cache=cache)
    assert r2.run and r2.run.stdout == b"8\n" and not r2.compile_cached
    assert cache.stats()["misses"] == 2
    r3 = run_code(
        pool,
        "bash",
        "cat data.txt; echo done > out.txt",
        files={"data.txt": b"hello\n"},
        fetch_files=["out.txt", "absent"],
    )
    assert r3.run and r3.run.stdout == b"hello\n" and r3.files == {"out.txt": b"done\n"}


def test_native_artifact_runs_through_its_loader_or_chmod(pool: SandboxPool) -> None:
    src = b'#include <stdio.h>\nint main(void){puts("static ok");return 0;}\n'
    for static in (False, True):
        argv = ["/usr/bin/gcc", "-O2", "-o", "main", "main.c", *(["-static"] if static else [])]
        r = pool.submit(
            argv,
            files={"main.c": src},
            collect=["main"],
            limits=RUN.replace(wall_time_s=30 * TIME_SCALE, cpu_time_s=30 * TIME_SCALE),
        ).result()
        if static and r.status is not Status.OK:
            pytest.skip(f"no static libc here: {r.stderr[-300:]!r}")
        assert r.ok, r.summary()
        binary = r.files["main"]
        interp = elf_interpreter(binary)
        run_argv = native_argv(binary)
        if static:
            assert interp is None and run_argv[0] == "/bin/sh"
        else:
            assert interp and "ld-linux" in interp and run_argv == [interp, "./main"]
        done = pool.submit(run_argv, files={"main": binary}).result()
        assert done.ok and done.stdout == b"static ok\n", done.summary()
    assert elf_interpreter(b"#!/bin/sh\n" + b"\0" * 100) is None
    assert native_argv(b"not elf")[0] == "/bin/sh"


# --- hostile programs ------------------------------------------------------------------------


def test_c_fork_bomb_is_contained(pool: SandboxPool, clean_host: None) -> None:
    bomb = "#include <unistd.h>\nint main(void){for(;;) fork(); return 0;}\n"
    r = run_code(pool, "c", bomb, run_limits=RUN.replace(max_pids=32))
    assert r.run is not None and r.run.status is Status.TIMEOUT, r.run.summary()


HOSTILE = {
    (
        "python",
        "fork",
    ): "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    ("python", "memory"): "a = []\nwhile True:\n    a.append(bytearray(1 << 20))\n",
    ("c", "memory"): (
        "#include <stdlib.h>\n#include <string.h>\n"
        "int main(void){for(;;){char*p=malloc(1<<20); if(p) memset(p,1,1<<20);}}\n"
    ),
    ("cpp", "fork"): "#include <unistd.h>\nint main(){for(;;) fork();}\n",
    ("cpp", "memory"): (
        "#include <string>\n#include <vector>\n"
        "int main(){std::vector<std::string> v; for(;;) v.emplace_back(1<<20, 'x');}\n"
    ),
    ("java", "fork"): (
        "public class Main { public static void main(String[] a) {\n"
        " while (true) new Thread(() -> { try { Thread.sleep(100000); }"
        " catch (Exception e) {} }).start(); } }\n"
    ),
    ("nodejs", "fork"): (
        "const { spawn } = require('child_process');\n"
        "for (;;) { try { spawn(process.execPath, [__filename]); } catch (e) {} }\n"
    ),
    ("nodejs", "memory"): "const a = []; for (;;) a.push(Buffer.alloc(1 << 20, 1));\n",
    ("go", "fork"): (
        'package main\nimport (\n\t"os"\n\t"os/exec"\n)\n'
        "func main() { for { _ = exec.Command(os.Args[0]).Start() } }\n"
    ),
    ("go", "memory"): (
        "package main\nfunc main() { var keep [][]byte\n"
        " for { b := make([]byte, 1<<20); for i := range b { b[i] = 1 }; keep = append(keep, b) } }\n"
    ),
    (
        "rust",
        "fork",
    ): 'extern "C" { fn fork() -> i32; }\nfn main() { loop { unsafe { fork(); } } }\n',
    ("rust", "memory"): (
        "fn main() { let mut keep: Vec<Vec<u8>> = Vec::new(); loop { keep.push(vec![1u8; 1 << 20]); } }\n"
    ),
    ("typescript", "fork"): (
        "declare var require: any;\ndeclare var process: any;\ndeclare var __filename: string;\n"
        "const { spawn } = require('child_process');\n"
        "for (;;) { try { spawn(process.execPath, [__filename]); } catch (e) {} }\n"
    ),
    ("typescript", "memory"): (
        "declare var Buffer: any;\nconst a: any[] = [];\nfor (;;) a.push(Buffer.alloc(1 << 20, 1));\n"
    ),
    ("bash", "fork"): "bomb() { bomb | bomb & }; bomb; while :; do sleep 1; done\n",
    ("bash", "memory"): "x=aaaaaaaa; while :; do x=$x$x; done\n",
    ("perl", "fork"): "fork while 1;\n",
    ("perl", "memory"): "my @a; push @a, 'x' x (1 << 20) while 1;\n",
}


@pytest.mark.parametrize(
    ("language", "kind"),
    [k for k in HOSTILE if LANGUAGES[k[0]].available],
    ids=lambda v: str(v),
)
def test_hostile_program_is_contained(
    pool: SandboxPool, language: str, kind: str, clean_host: None
) -> None:
    lim = RUN.replace(
        memory_bytes=256 << 20,
        max_pids=32,
        wall_time_s=1.0 * TIME_SCALE,
        cpu_time_s=1.0 * TIME_SCALE,
    )
    if language == "java":
        lim = lim.replace(wall_time_s=3 * TIME_SCALE, cpu_time_s=3 * TIME_SCALE)
    r = run_code(pool, language, HOSTILE[language, kind], run_limits=lim)
    assert r.run is not None, r.compile
    assert r.run.status not in (Status.OK, Status.SANDBOX_ERROR), r.run.summary()
    if kind == "memory":
        assert r.run.peak_memory_bytes is None or r.run.peak_memory_bytes <= 2 * lim.memory_bytes


@pytest.mark.skipif(not LANGUAGES["java"].available, reason="no JDK under /usr")
def test_java_memory_bomb_is_contained(pool: SandboxPool, clean_host: None) -> None:
    bomb = (
        "import java.util.*;\npublic class Main { public static void main(String[] a) {\n"
        " List<long[]> keep = new ArrayList<>(); while (true) keep.add(new long[1 << 23]); } }\n"
    )
    lim = RUN.replace(
        memory_bytes=256 << 20, wall_time_s=10 * TIME_SCALE, cpu_time_s=10 * TIME_SCALE
    )
    r = run_code(pool, "java", bomb, run_limits=lim)
    assert r.run is not None and not r.run.ok, r
    oom = r.run.status is Status.RUNTIME_ERROR and b"OutOfMemoryError" in r.run.stderr
    assert oom or r.run.status is Status.MEMORY_LIMIT, r.run.summary()
    # The Evaluator names it a memory limit.
    with Evaluator(pool, timeout=8 * TIME_SCALE) as ev:
        j = ev.judge(IOTask("bomb", "", (IOCase("", "x"),), language="java"), bomb)
    assert j.error_class is ErrorClass.MEMORY_LIMIT, j.feedback


COMPILE_SHORT = Limits(
    wall_time_s=3.0 * TIME_SCALE,
    cpu_time_s=3.0 * TIME_SCALE,
    memory_bytes=256 << 20,
    max_pids=32,
    max_output_bytes=64 << 10,
)


@pytest.mark.parametrize(
    "source",
    [
        # constexpr evaluation within every per-loop limit, but some 4e10 steps in all
        "constexpr long f(){long s=0; for(long i=0;i<200000;i++) for(long j=0;j<200000;j++)"
        " s+=j; return s;}\nconstexpr long x = f();\nint main(){return (int)x;}\n",
        '#include "/dev/zero"\nint main(){}\n',
    ],
    ids=["constexpr-forever", "include-dev-zero"],
)
def test_compile_that_never_ends_is_contained(
    pool: SandboxPool, source: str, clean_host: None
) -> None:
    cache = CompileCache()
    r = run_code(pool, "cpp", source, compile_limits=COMPILE_SHORT, cache=cache)
    assert r.run is None and r.compile is not None
    assert r.compile.status in (Status.TIMEOUT, Status.MEMORY_LIMIT, Status.OUTPUT_LIMIT), (
        r.compile.summary()
    )
    assert r.compile.wall_time_s < 10 * TIME_SCALE
    assert len(cache) == 0  # a compile stopped by a limit is not cached


def test_output_floods_are_capped(pool: SandboxPool, clean_host: None) -> None:
    flood = '#include <stdio.h>\nint main(void){for(;;) fputs("flood flood flood\\n", stdout);}\n'
    r = run_code(pool, "c", flood)
    assert r.run is not None and r.run.status is Status.OUTPUT_LIMIT, r.run.summary()
    assert len(r.run.stdout) <= RUN.max_output_bytes
    # A compile whose diagnostics flood: capped too, and a failed compile.
    spam = "int main(){\n" + "undeclared_name_xyz;\n" * 20000 + "}\n"
    c = run_code(pool, "c", spam, compile_limits=COMPILE_SHORT)
    assert c.run is None and c.compile is not None and not c.compile.ok
    assert len(c.compile.stderr) <= COMPILE_SHORT.max_output_bytes


# --- names and toolchains ----------------------------------------------------------------------


def test_names_and_aliases() -> None:
    for alias, canon in {
        "C++": "cpp",
        "cpp": "cpp",
        "js": "nodejs",
        "javascript": "nodejs",
        "NodeJS": "nodejs",
        "Python3": "python",
        "sh": "bash",
        "golang": "go",
        "ts": "typescript",
        "rs": "rust",
        "R": "R",
    }.items():
        assert canonical_name(alias) == canon
    # Every language of SandboxFusion's that runs a program (not a test framework) is known.
    for sf in (
        "python",
        "cpp",
        "nodejs",
        "go",
        "java",
        "php",
        "bash",
        "typescript",
        "rust",
        "lua",
        "R",
        "perl",
        "ruby",
        "julia",
    ):
        assert canonical_name(sf) in LANGUAGES
    with pytest.raises(UnknownLanguage) as e:
        resolve_language("cobol")
    assert isinstance(e.value, ValueError)
    assert e.value.language == "cobol" and "cpp" in e.value.known and "cobol" in str(e.value)
    with pytest.raises(TypeError):
        canonical_name(3)  # type: ignore[arg-type]


def test_missing_toolchain_is_reported(pool: SandboxPool, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [n for n, lang in LANGUAGES.items() if not lang.available]
    for name in missing:
        with pytest.raises(ToolchainMissing) as e:
            resolve_language(name)
        assert e.value.language == name and e.value.missing
        assert all(m in str(e.value) for m in e.value.missing)
        with pytest.raises(ToolchainMissing):
            run_code(pool, name, "x")
    # A toolchain outside what a box sees counts as missing, with the reason.
    monkeypatch.setattr(toolchain_mod, "VISIBLE_ROOTS", ("/nonexistent-root",))
    toolchain_mod.refresh()
    try:
        with pytest.raises(ToolchainMissing) as e:
            resolve_language("cpp")
        assert e.value.missing == ("g++",) and "outside" in e.value.detail
        task = IOTask("t", "", (IOCase("", ""),), language="cpp")  # the name is known
        with Evaluator(pool) as ev, pytest.raises(ToolchainMissing):
            ev.judge(task, "int main(){}")
    finally:
        monkeypatch.undo()
        toolchain_mod.refresh()
    assert resolve_language("cpp").name == "cpp"


def test_rustup_toolchain_outside_usr_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    cargo = "/root/.cargo/bin/rustc"
    if not os.path.exists(cargo):
        pytest.skip("there is no rustup toolchain to name")
    # Where /usr/bin/rustc is installed too, it is the one used; hide it to see rustup's named.
    monkeypatch.setattr(toolchain_mod, "SEARCH_PATH", (os.path.dirname(cargo),))
    monkeypatch.setenv("PATH", os.path.dirname(cargo))
    toolchain_mod.refresh()
    try:
        with pytest.raises(ToolchainMissing) as e:
            resolve_language("rust")
        assert e.value.missing == ("rustc",) and cargo in e.value.detail
    finally:
        monkeypatch.undo()
        toolchain_mod.refresh()
    if os.path.exists("/usr/bin/rustc"):  # rustup's comes first on PATH; /usr's is chosen
        assert LANGUAGES["rust"].toolchain().paths["rustc"].startswith("/usr/")


def test_bad_arguments(pool: SandboxPool) -> None:
    with pytest.raises(TypeError):
        run_code(pool, "c", b"int main(){}")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run_code(pool, "bash", "true", files={"a": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        run_code(pool, "bash", "true", run_limits="1s")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run_code(pool, "bash", "true", fetch_files="out.txt")


# --- the Evaluator ---------------------------------------------------------------------------


def test_evaluator_compiles_once_per_completion(pool: SandboxPool, clean_host: None) -> None:
    from agentrl.languages import default_cache

    cases = tuple(IOCase(f"add {i} {i}\n", f"{2 * i}\n") for i in range(20))
    task = IOTask("sum", "", cases, language="c++", compare="codecontests")
    assert task.language == "cpp" and task.compare == "codecontests"
    code = PROGRAMS["cpp"] + "// evaluator " + os.urandom(4).hex() + "\n"
    with Evaluator(pool, timeout=2 * TIME_SCALE) as ev:
        before = default_cache().stats()
        j = ev.judge(task, code)
        after = default_cache().stats()
        assert j.passed and j.n_passed == 20, j.feedback
        assert after["misses"] - before["misses"] == 1
        wrong = ev.judge(task, code.replace("a+b", "a+b+1"))
        assert wrong.error_class is ErrorClass.WRONG_ANSWER and wrong.n_passed == 0
        broken = ev.judge(task, "int main( {")
        assert broken.error_class is ErrorClass.COMPILE_ERROR and broken.n_cases == 20
        assert "error" in broken.feedback and not broken.masked
        slow = ev.judge(IOTask("t", "", (IOCase("loop", ""),), language="cpp"), code)
        assert slow.error_class is ErrorClass.TIMEOUT
        crash = ev.judge(IOTask("t", "", (IOCase("x", ""),), language="cpp"), code)
        assert crash.error_class is ErrorClass.RUNTIME_ERROR
        many = ev.judge_many([(task, code), (task, "int main( {"), (task, code)])
        assert [m.error_class for m in many] == [
            ErrorClass.PASSED,
            ErrorClass.COMPILE_ERROR,
            ErrorClass.PASSED,
        ]
        aj = asyncio.run(ev.ajudge(task, code))
        assert aj.passed
        aj = asyncio.run(ev.ajudge(task, "int main( {"))
        assert aj.error_class is ErrorClass.COMPILE_ERROR
        node = task_from_dict({"inputs": ["add 1 2"], "outputs": ["3"], "language": "javascript"})
        assert node.language == "nodejs"
        assert ev.judge(node, PROGRAMS["nodejs"]).passed


def test_io_task_checks_language_and_mode() -> None:
    with pytest.raises(UnknownLanguage):
        IOTask("t", "", (IOCase("", ""),), language="cobol")
    with pytest.raises(ValueError, match="comparison mode"):
        IOTask("t", "", (IOCase("", ""),), compare="fuzzy")
    assert IOTask("t", "", (IOCase("", ""),), compare="lcb").compare == "livecodebench"
    assert IOTask("t", "", (IOCase("", ""),)).language == "python"


# --- the cache alone (no sandbox) ----------------------------------------------------------


def _outcome(status: Status = Status.OK, size: int = 10) -> Compiled:
    r = ExecResult(status=status, exit_code=0 if status is Status.OK else 1)
    ok = status is Status.OK
    return Compiled(r, {"main": b"x" * size} if ok else {}, ok)


def test_cache_lru_bounds_and_what_is_kept() -> None:
    cache = CompileCache(max_entries=2, max_bytes=10_000)
    calls: list[str] = []

    def make(key: str, status: Status = Status.OK, size: int = 10) -> Compiled:
        out, _ = cache.get_or_compile(key, lambda: calls.append(key) or _outcome(status, size))
        return out

    make("a"), make("b"), make("a")  # "a" used last: "b" goes first
    make("c")
    assert calls == ["a", "b", "c"] and cache.stats()["evictions"] == 1
    make("a"), make("b")
    assert calls == ["a", "b", "c", "b"]
    # A compiler's refusal is kept; a compile stopped by a limit is not.
    make("err", Status.RUNTIME_ERROR), make("err", Status.RUNTIME_ERROR)
    make("slow", Status.TIMEOUT), make("slow", Status.TIMEOUT)
    assert calls.count("err") == 1 and calls.count("slow") == 2
    # The byte bound: an entry larger than the whole cache is not kept; others make room.
    make("huge", size=20_000), make("huge", size=20_000)
    assert calls.count("huge") == 2
    cache2 = CompileCache(max_entries=100, max_bytes=3000)
    for k in "pqrs":
        cache2.get_or_compile(k, lambda: _outcome(size=1000))
    assert cache2.stats()["bytes"] <= 3000 and len(cache2) == 2
    cache2.clear()
    assert len(cache2) == 0 and cache2.stats()["hits"] == 0
    with pytest.raises(ValueError):
        CompileCache(max_entries=-1)


def test_cache_leader_failure_lets_a_waiter_compile() -> None:
    cache = CompileCache()
    started, release = threading.Event(), threading.Event()
    results: list[tuple[Compiled, bool]] = []

    def failing() -> Compiled:
        started.set()
        release.wait(5)
        raise RuntimeError("pool closed")

    def leader() -> None:
        with pytest.raises(RuntimeError):
            cache.get_or_compile("k", failing)

    t1 = threading.Thread(target=leader)
    t1.start()
    started.wait(5)
    t2 = threading.Thread(target=lambda: results.append(cache.get_or_compile("k", _outcome)))
    t2.start()
    while cache.stats()["coalesced"] == 0:
        time.sleep(0.01)
    release.set()
    t1.join(5)
    t2.join(5)
    assert results and results[0][0].ok and results[0][1] is False  # it compiled itself
    assert cache.stats()["inflight"] == 0 and len(cache) == 1


def test_cache_async_waiter_cancelled_leaves_the_compile() -> None:
    cache = CompileCache()

    async def main() -> None:
        gate = asyncio.Event()

        async def slow() -> Compiled:
            await gate.wait()
            return _outcome()

        leader = asyncio.create_task(cache.aget_or_compile("k", slow))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(cache.aget_or_compile("k", slow))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.set()
        out, cached = await leader
        assert out.ok and not cached
        # A sync caller now hits.
        assert cache.get_or_compile("k", _outcome)[1] is True

    asyncio.run(main())
