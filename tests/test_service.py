"""The sandbox service (``agentrl sandbox-server``) on loopback, driven by real clients:
verl's own SandboxFusion client functions, the payloads ROLL and SkyRL send, httpx, and
:class:`agentrl.client.SandboxClient`; auth, the request bounds, 429 under overload, the
SIGTERM drain, hostile programs (host checked after), and the OpenAPI document fuzzed."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from agentrl import Limits, Status  # noqa: E402
from agentrl.client import SandboxClient, ServiceError, ServiceUnavailable  # noqa: E402
from agentrl.service import ServiceConfig  # noqa: E402
from agentrl.service.app import create_app  # noqa: E402
from agentrl.service.server import _server_class, uvicorn_config  # noqa: E402
from conftest import TIME_SCALE, assert_host_clean  # noqa: E402

TOKEN = "t0ken-" + os.urandom(8).hex()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """The real app on uvicorn (uvloop, httptools) in a thread of this process."""

    def __init__(self, config: ServiceConfig) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(config)
        self.server = _server_class()(
            uvicorn_config(self.app, "127.0.0.1", self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    with ThreadServer(
        ServiceConfig(token=TOKEN, workers=2, max_body_bytes=1 << 20, max_output_bytes=4096)
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(server: ThreadServer) -> Iterator[Any]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def server_inflight(server: ThreadServer) -> int:
    return int(httpx.get(server.url + "/health", timeout=10).json()["inflight"])


def run_code(http: Any, **payload: Any) -> dict:
    r = http.post("/run_code", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


# --- verl's own client -----------------------------------------------------------------------

# Programs per SandboxFusion language name: (correct, wrong, timeout, runtime error, compile
# error or None). Each reads one integer and prints its double.
PROGRAMS: dict[str, tuple[str, str, str, str, str | None]] = {
    "python": (
        "print(2 * int(input()))",
        "print(2 * int(input()) + 1)",
        "while True:\n    pass",
        "raise SystemExit(3)",
        None,
    ),
    "cpp": (
        "#include <iostream>\nint main() { long long x; std::cin >> x; std::cout << 2 * x << '\\n'; }",
        "#include <iostream>\nint main() { long long x; std::cin >> x; std::cout << 2 * x + 1 << '\\n'; }",
        "int main() { volatile unsigned long x = 0; for (;;) x++; }",
        "#include <cstdlib>\nint main() { std::exit(3); }",
        "int main() { return undeclared_name; }",
    ),
    "java": (
        "import java.util.*;\npublic class Main { public static void main(String[] a) {\n"
        "  long x = new Scanner(System.in).nextLong(); System.out.println(2 * x); } }",
        "import java.util.*;\npublic class Main { public static void main(String[] a) {\n"
        "  long x = new Scanner(System.in).nextLong(); System.out.println(2 * x + 1); } }",
        "public class Main { public static void main(String[] a) { long x = 0; while (true) x++; } }",
        "public class Main { public static void main(String[] a) { System.exit(3); } }",
        "public class Main { public static void main(String[] a) { int x = \"s\"; } }",
    ),
    "nodejs": (
        "const x = parseInt(require('fs').readFileSync(0, 'utf8')); console.log(2 * x);",
        "const x = parseInt(require('fs').readFileSync(0, 'utf8')); console.log(2 * x + 1);",
        "while (true) {}",
        "process.exit(3);",
        None,
    ),
    "bash": ("read x; echo $((2 * x))", "read x; echo $((2 * x + 1))", "while :; do :; done",
             "exit 3", None),
    "go": (
        'package main\nimport "fmt"\nfunc main() { var x int64; fmt.Scan(&x); fmt.Println(2 * x) }',
        'package main\nimport "fmt"\nfunc main() { var x int64; fmt.Scan(&x); fmt.Println(2*x + 1) }',
        "package main\nfunc main() { x := 0; for { x++ } }",
        'package main\nimport "os"\nfunc main() { os.Exit(3) }',
        "package main\nfunc main() { undefined() }",
    ),
    "rust": (
        "use std::io::*;\nfn main() { let mut s = String::new(); stdin().read_line(&mut s).unwrap();"
        " let x: i64 = s.trim().parse().unwrap(); println!(\"{}\", 2 * x); }",
        "use std::io::*;\nfn main() { let mut s = String::new(); stdin().read_line(&mut s).unwrap();"
        " let x: i64 = s.trim().parse().unwrap(); println!(\"{}\", 2 * x + 1); }",
        "fn main() { loop {} }",
        "fn main() { std::process::exit(3); }",
        "fn main() { let x: i32 = \"s\"; }",
    ),
    "typescript": (
        "declare var require: any;\nconst x: number = parseInt(require('fs').readFileSync(0, 'utf8'));"
        " console.log(2 * x);",
        "declare var require: any;\nconst x: number = parseInt(require('fs').readFileSync(0, 'utf8'));"
        " console.log(2 * x + 1);",
        "while (true) {}",
        "declare var process: any;\nprocess.exit(3);",
        "const x: number = 'not a number';",
    ),
}  # fmt: skip


def verl_sandbox_fusion() -> Any:
    """verl's SandboxFusion client module (``verl/utils/reward_score/sandbox_fusion/utils.py``,
    verl 0.9.1 as installed), loaded from its file: its own imports are requests and the
    standard library, and importing the ``verl`` package first would cost seconds of torch."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed")
    name = "verl_sandbox_fusion_utils"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(spec.submodule_search_locations[0], "utils/reward_score/sandbox_fusion/utils.py")
    mod_spec = importlib.util.spec_from_file_location(name, path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    mod_spec.loader.exec_module(module)
    return module


def _sandboxfusion_languages() -> list[Any]:
    """Every language of PROGRAMS, skipped (with the server's reason) where this host lacks
    its toolchain."""
    from agentrl.languages import ToolchainMissing, resolve_language

    out = []
    for name in PROGRAMS:
        try:
            resolve_language(name)
            out.append(name)
        except ToolchainMissing as e:
            out.append(pytest.param(name, marks=pytest.mark.skip(reason=str(e))))
    return out


@pytest.mark.parametrize("language", _sandboxfusion_languages())
def test_verl_check_correctness_gives_the_verdicts_verl_expects(
    server: ThreadServer, language: str
) -> None:
    """verl's ``check_correctness`` (its SandboxFusion client, unchanged) against the server;
    the token rides in the URL path since verl sends no headers."""
    check_correctness = verl_sandbox_fusion().check_correctness
    url = f"{server.url}/t/{TOKEN}/run_code"
    ok, wrong, loop, crash, broken = PROGRAMS[language]
    cases = {"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}
    # verl gives the compile the same time-out as the run; javac, rustc -O and tsc take one
    # to two seconds of CPU (tsc loads its lib .d.ts files), more on a loaded host
    slow = language in ("java", "rust", "typescript")
    t = max(5, int(5 * TIME_SCALE)) if slow else max(2, int(2 * TIME_SCALE))
    results, meta = check_correctness(url, cases, ok, timeout=10, language=language)
    assert results == [True, True], meta
    one = {"inputs": ["4\n"], "outputs": ["8\n"]}  # one case each from here: CI time
    results, meta = check_correctness(url, one, wrong, timeout=10, language=language)
    assert results == [False], meta
    results, meta = check_correctness(url, one, loop, timeout=t, language=language)
    assert results == [-3], meta
    results, meta = check_correctness(url, one, crash, timeout=10, language=language)
    assert results == [-2], meta
    assert meta[0]["exit_code"] == 3
    if broken is not None:
        results, meta = check_correctness(url, one, broken, timeout=10, language=language)
        assert results == [-4], meta
        assert meta[0]["compile_status"] == "Finished"
        assert meta[0]["compile_stderr"] and meta[0]["api_response"]["run_result"] is None


def test_sandboxfusion_names_outside_verls_list(http: Any) -> None:
    """``c``, ``javascript`` and ``perl`` (names SandboxFusion's users send, not in verl's
    list) and the missing toolchain's 422 naming what is missing."""
    from agentrl.languages import LANGUAGES, ToolchainMissing, resolve_language

    for language, code in [
        ("c", '#include <stdio.h>\nint main(void) { puts("c"); return 0; }'),
        ("javascript", "console.log('c')"),
        ("perl", 'print "c\\n";'),
    ]:
        body = run_code(http, language=language, code=code)
        assert body["status"] == "Success" and body["run_result"]["stdout"] == "c\n", body
        if language == "c":
            assert body["compile_result"]["status"] == "Finished"
    for name in LANGUAGES:
        try:
            resolve_language(name)
        except ToolchainMissing as e:
            r = http.post("/run_code", json={"code": "x", "language": name})
            assert r.status_code == 422 and e.missing[0] in r.text, r.text
            break
    langs = http.get("/v1/languages").json()
    assert langs["python"]["available"] is True and "nodejs" in langs


def test_verl_compute_score_fn_name_wrapper(server: ThreadServer) -> None:
    """verl's LeetCode-style ``fn_name`` wrapper (JSON arguments on stdin)."""
    check_correctness = verl_sandbox_fusion().check_correctness
    url = f"{server.url}/t/{TOKEN}/run_code"
    code = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
    cases = {"inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"], "fn_name": "add"}
    results, meta = check_correctness(url, cases, code, timeout=10)
    assert results == [True, True], meta


# --- the payloads of other stacks ------------------------------------------------------------


def test_skyrl_payload_with_a_module_file(http: Any) -> None:
    """SkyRL's ``code_exec_sandboxfusion`` shape: no compile_timeout, a ``files`` entry the
    code imports, ``stdin`` null."""
    solution = base64.b64encode(b"def answer():\n    return 42\n").decode()
    body = run_code(
        http,
        language="python",
        code="from solution import answer\nprint(answer())",
        stdin=None,
        run_timeout=10,
        memory_limit_MB=1024,
        files={"solution.py": solution},
    )
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "42\n"
    assert body["compile_result"] is None


def test_roll_payload_with_extra_fields_and_trace_header(http: Any) -> None:
    """ROLL's code sandbox worker sends ``expected_stdout`` (ignored) and its own header."""
    r = http.post(
        "/run_code",
        headers={"eagleeye-traceid": "abc", "Accept": "application/json"},
        json={
            "compile_timeout": 30,
            "run_timeout": 30,
            "code": "import sys\nprint(sys.stdin.read().upper(), end='')",
            "language": "python",
            "stdin": "hello",
            "expected_stdout": "HELLO",
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "HELLO"
    assert set(body) >= {"status", "message", "compile_result", "run_result", "files"}
    assert "executor_pod_name" in body


def test_fetch_files_come_back_base64(http: Any) -> None:
    body = run_code(
        http,
        language="python",
        code="open('out.bin','wb').write(bytes(range(256)))",
        fetch_files=["out.bin", "missing.txt"],
    )
    assert body["status"] == "Success", body
    assert base64.b64decode(body["files"]["out.bin"]) == bytes(range(256))
    assert "missing.txt" not in body["files"]


def test_unknown_language_is_422(http: Any) -> None:
    r = http.post("/run_code", json={"code": "x", "language": "cobol-85"})
    assert r.status_code == 422
    assert "cobol-85" in r.text


def test_bad_fields_are_422_naming_them(http: Any) -> None:
    for payload, word in [
        ({"code": "1", "language": "python", "memory_limit_MB": 2}, "memory_limit_MB"),
        ({"code": "1", "language": "python", "run_timeout": -1}, "run_timeout"),
        ({"code": "1", "language": "python", "run_timeout": 10_000}, "run_timeout"),
        ({"code": "1", "language": "python", "files": {"a": "%%%"}}, "base64"),
        ({"code": "1", "language": "python", "files": {"../x": "AA=="}}, ""),
        ({"language": "python"}, "code"),
    ]:
        r = http.post("/run_code", json=payload)
        assert r.status_code == 422, (payload, r.text)
        assert word in r.text, (payload, r.text)


def test_memory_limit_mb_is_enforced(http: Any) -> None:
    body = run_code(
        http,
        language="python",
        code="x = bytearray(200 << 20)\nprint('survived')",
        memory_limit_MB=64,
    )
    assert body["status"] == "Failed", body
    rr = body["run_result"]
    assert rr["status"] == "Finished" and rr["return_code"] == -9
    assert rr["agentrl_status"] == "memory_limit" and "survived" not in rr["stdout"]
    body = run_code(http, language="python", code="x = bytearray(20 << 20)\nprint('fits')")
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "fits\n"


def test_output_over_the_cap_is_truncated_and_flagged_without_a_stall(http: Any) -> None:
    t0 = time.monotonic()
    body = run_code(
        http, language="python", code="while True:\n    print('y' * 1000)", run_timeout=20
    )
    assert time.monotonic() - t0 < 10 * TIME_SCALE
    rr = body["run_result"]
    assert body["status"] == "Failed" and "truncated" in body["message"]
    assert rr["stdout_truncated"] is True and len(rr["stdout"]) == 4096


def test_no_network_in_the_box(http: Any, server: ThreadServer) -> None:
    """The box has no route out: not even to this server on the host's loopback."""
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {server.port}), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
    )
    body = run_code(http, language="python", code=code)
    assert body["run_result"]["stdout"].startswith("blocked"), body


# --- agentrl's own API -----------------------------------------------------------------------


def test_v1_run_streams_ndjson_as_jobs_finish(http: Any) -> None:
    jobs = [
        {"source": "import time; time.sleep(1.0); print('slow')"},
        {"argv": ["/bin/sh", "-c", "cat in.txt; echo made > out.txt"],
         "files": {"in.txt": base64.b64encode(b"fed\n").decode()}, "collect": ["out.txt"]},
        {"source": "import sys; sys.stderr.write('e'); sys.exit(4)", "stdin": "x"},
    ]  # fmt: skip
    lines = []
    with http.stream("POST", "/v1/run", json={"jobs": jobs}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            if line:
                lines.append((time.monotonic(), json.loads(line)))
    order = [rec["index"] for _, rec in lines]
    assert sorted(order) == [0, 1, 2] and order[-1] == 0, order  # the slow one last
    res = {rec["index"]: rec["result"] for _, rec in lines}
    assert base64.b64decode(res[1]["stdout_b64"]) == b"fed\n"
    assert base64.b64decode(res[1]["files_b64"]["out.txt"]) == b"made\n"
    assert res[2]["status"] == "runtime_error" and res[2]["exit_code"] == 4
    assert base64.b64decode(res[2]["stderr_b64"]) == b"e"
    assert res[0]["status"] == "ok"


def test_v1_run_refuses_bad_jobs_before_running_any(http: Any) -> None:
    for payload, word in [
        ({"jobs": [{"source": "1"}, {"argv": ["x"], "source": "1"}]}, "job 1"),
        ({"jobs": [{"source": "1", "limits": {"wall_time_s": 1e6}}]}, "wall_time_s"),
        ({"jobs": [{"source": "1", "limits": {"memory_bytes": 1024}}]}, "memory_bytes"),
        ({"jobs": [{"argv": ["/bin/true"], "collect": ["/etc/passwd"]}]}, "job 0"),
        ({"jobs": [{"argv": ["/bin/true"], "files": {"a/../../x": ""}}]}, "leaves"),
        ({"jobs": []}, "jobs"),
    ]:
        r = http.post("/v1/run", json=payload)
        assert r.status_code == 422, (payload, r.text)
        assert word in r.text, (payload, r.text)


def test_v1_judge_gives_partial_credit_and_error_classes(http: Any) -> None:
    fn = {
        "task_id": "add",
        "prompt": "def add(a, b):\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    }
    io = {"task_id": "io", "inputs": ["1\n", "2\n", "3\n"], "outputs": ["2\n", "4\n", "7\n"]}
    items = [
        {"task": fn, "completion": "    return a + b\n"},
        {"task": io, "completion": "print(2 * int(input()))"},
        {"task": {"task_id": "loop", "inputs": ["1\n"], "outputs": ["2\n"]},
         "completion": "while True: pass"},
    ]  # fmt: skip
    with http.stream("POST", "/v1/judge", json={"items": items, "timeout": 0.5}) as r:
        assert r.status_code == 200
        recs = [json.loads(x) for x in r.iter_lines() if x]
    by = {rec["index"]: rec["judgement"] for rec in recs}
    assert sorted(by) == [0, 1, 2]
    assert by[0]["passed"] and by[0]["error_class"] == "passed"
    assert by[1]["n_passed"] == 2 and by[1]["fraction"] == pytest.approx(2 / 3)
    assert by[1]["error_class"] == "wrong_answer"
    assert by[2]["error_class"] == "timeout" and by[2]["n_passed"] == 0
    r = http.post("/v1/judge", json={"items": [{"task": {"inputs": 3}, "completion": ""}]})
    assert r.status_code == 422 and "items[0]" in r.text


def test_v1_judge_compiles_once_and_classes_a_compile_error(http: Any) -> None:
    """A C++ stdin/stdout task (``language``): right on two of three cases, and a program
    that does not compile is ``compile_error`` on every case."""
    task = {"task_id": "double", "language": "cpp", "inputs": ["1\n", "2\n", "3\n"],
            "outputs": ["2\n", "4\n", "7\n"], "compare": "whitespace"}  # fmt: skip
    good = PROGRAMS["cpp"][0]
    items = [{"task": task, "completion": good}, {"task": task, "completion": "int main( {"}]
    r = http.post("/v1/judge", json={"items": items, "stream": False})
    assert r.status_code == 200, r.text
    ok, bad = (x["judgement"] for x in r.json()["results"])
    assert (ok["n_passed"], ok["n_cases"], ok["error_class"]) == (2, 3, "wrong_answer"), ok
    assert bad["error_class"] == "compile_error" and bad["n_passed"] == 0, bad


def test_openapi_document_is_served(http: Any) -> None:
    doc = http.get("/openapi.json").json()
    assert {"/run_code", "/v1/run", "/v1/judge", "/v1/ping", "/health"} <= set(doc["paths"])
    assert http.get("/v1/ping").json() == "pong"


# --- production behaviour --------------------------------------------------------------------


def test_auth_refuses_missing_and_wrong_tokens(server: ThreadServer) -> None:
    payload = {"code": "print(1)", "language": "python"}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/run_code", json=payload)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = c.post("/run_code", json=payload, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert r.status_code == 401
        r = c.post("/run_code", json=payload, headers={"Authorization": f"Basic {TOKEN}"})
        assert r.status_code == 401
        assert c.post(f"/t/{TOKEN[:-1]}/run_code", json=payload).status_code == 401
        assert c.get("/openapi.json").status_code == 401
        assert c.get("/health").status_code == 200  # a load balancer's probe
        r = c.post("/run_code", json=payload, headers=AUTH)
        assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "1\n"


def test_trusted_networks_need_no_token() -> None:
    """A client in ``--trust`` networks (SkyRL's, which cannot send a token) is served without
    one; the token is still required of the rest."""
    with pytest.raises(ValueError, match="needs a token"):
        ServiceConfig(trusted_networks=("10.0.0.0/8",))
    with pytest.raises(ValueError, match="not a network"):
        ServiceConfig(token="x" * 16, trusted_networks=("ten",))
    payload = {"code": "print(5)", "language": "python"}
    for nets, expect in [(("127.0.0.0/8",), 200), (("10.0.0.0/8",), 401)]:
        with ThreadServer(ServiceConfig(token=TOKEN, workers=1, trusted_networks=nets)) as s:
            r = httpx.post(s.url + "/run_code", json=payload, timeout=30)
            assert r.status_code == expect, r.text


def test_no_token_means_loopback_only() -> None:
    from agentrl.cli.main import main
    from agentrl.service.server import check_bind

    with pytest.raises(ValueError, match="without a token"):
        check_bind("0.0.0.0", ServiceConfig())
    check_bind("0.0.0.0", ServiceConfig(token="x" * 16))
    check_bind("127.0.0.1", ServiceConfig())
    check_bind("::1", ServiceConfig())
    assert main(["sandbox-server", "--host", "0.0.0.0", "--port", "1"]) == 2


def test_request_size_bound_is_413(http: Any) -> None:
    big = {"code": "#" + "x" * (2 << 20), "language": "python"}
    assert http.post("/run_code", json=big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"code": "#'
        for _ in range(40):
            yield b"x" * 65536
        yield b'", "language": "python"}'

    r = http.post("/run_code", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_overload_is_429_with_retry_after_and_the_client_retries() -> None:
    with ThreadServer(ServiceConfig(token=TOKEN, workers=1, max_inflight=2)) as s:

        async def burst() -> list[Any]:
            async with httpx.AsyncClient(base_url=s.url, headers=AUTH, timeout=60) as c:
                payload = {"code": "import time; time.sleep(0.6)", "language": "python"}
                return await asyncio.gather(*(c.post("/run_code", json=payload) for _ in range(6)))

        rs = asyncio.run(burst())
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) >= 2 and 429 in codes, codes
        for r in rs:
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
            else:
                assert r.json()["status"] == "Success"
        with SandboxClient(s.url, token=TOKEN, max_retry_wait=0.5) as client:
            futs = [
                client.submit_python("import time; time.sleep(0.3); print(7)") for _ in range(6)
            ]
            assert [f.result(60).stdout for f in futs] == [b"7\n"] * 6
            assert client.stats()["busy"] > 0 and client.stats()["retries"] > 0


# --- the client as an executor ---------------------------------------------------------------


def test_client_executor_surface_round_robin_and_failover(server: ThreadServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with SandboxClient([server.url, dead, server.url], token=TOKEN, max_retry_wait=0.2) as c:
        assert c.workers == 64
        r = c.submit(["/bin/echo", "hi"]).result(60)
        assert r.status is Status.OK and r.stdout == b"hi\n"
        r = c.submit_python(
            "import sys; data = sys.stdin.read(); open('o', 'w').write(data[::-1])",
            stdin=b"abc",
            collect=["o"],
            limits=Limits(wall_time_s=5, cpu_time_s=5),
        ).result(60)
        assert r.ok and r.files == {"o": b"cba"}
        out = list(c.map(["print(1)", ["/bin/echo", "2"], {"source": "print(3)"}] * 2))
        assert [x.stdout for x in out] == [b"1\n", b"2\n", b"3\n"] * 2

        async def coro() -> list[Any]:
            return await asyncio.gather(c.run(["/bin/echo", "a"]), c.run_python("print('b')"))

        a, b = asyncio.run(coro())
        assert (a.stdout, b.stdout) == (b"a\n", b"b\n")
        r = c.submit_python("import time; time.sleep(9)", limits=Limits(wall_time_s=0.5)).result(60)
        assert r.status is Status.TIMEOUT
        st = c.stats()
        assert st["per_url"][server.url] >= 9 and st["per_url"][dead] == 0
        assert st["completed"] == st["submitted"] and st["retries"] >= 1
        with pytest.raises(TypeError, match="priority"):
            c.submit(["/bin/true"], priority=1)
        with pytest.raises(ServiceError) as e:
            c.submit(["/bin/true"], limits=Limits(wall_time_s=5000, cpu_time_s=5000)).result(60)
        assert e.value.status == 422
        assert c.run_code("print(6*7)")["run_result"]["stdout"] == "42\n"
        judged = c.judge([({"task_id": "t", "inputs": ["1\n"], "outputs": ["1\n"]}, "print(1)")])
        assert judged[0]["judgement"]["passed"] is True
    with (
        SandboxClient(dead, retries=2, max_retry_wait=0.05) as c,
        pytest.raises(ServiceUnavailable),
    ):
        c.submit(["/bin/true"]).result(30)


# --- drain and containment -------------------------------------------------------------------


def test_evaluator_judges_through_the_client(server: ThreadServer) -> None:
    """The client is an ``agentrl.pool.Executor``: the Evaluator judges on the server with it,
    function tasks and compiled stdin/stdout tasks alike, with the local verdicts."""
    from agentrl import Evaluator
    from agentrl.evaluation import IOCase, IOTask, load_humaneval
    from agentrl.pool import Executor

    problems = load_humaneval()[:6]
    io = IOTask(
        "twice",
        "print twice the input",
        (IOCase("3\n", "6\n"), IOCase("5\n", "10\n")),
        language="cpp",
    )
    ok_cpp = (
        "#include <iostream>\nint main() { long x; std::cin >> x; std::cout << 2 * x << '\\n'; }"
    )
    bad_cpp = "int main() { return }"
    with SandboxClient(server.url, token=TOKEN) as client:
        assert isinstance(client, Executor)
        with Evaluator(client, timeout=3.0 * TIME_SCALE) as ev:
            pairs = [(t, t.canonical_solution) for t in problems]
            pairs += [(problems[0], "    return None\n"), (io, ok_cpp), (io, bad_cpp)]
            got = ev.judge_many(pairs)
    assert [j.passed for j in got] == [True] * 6 + [False, True, False], got
    assert got[6].error_class.value != "passed" and got[8].error_class.value == "compile_error"


def test_sigterm_drains_in_flight_jobs_and_loses_none(tmp_path: Path) -> None:
    """A real ``agentrl sandbox-server`` process: SIGTERM while jobs run; each accepted job
    is answered, new connections are refused, and the process exits 0."""
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl", "sandbox-server", "--port", str(port),
         "--workers", "2", "--token-file", str(token_file), "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60 * TIME_SCALE
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        payload = {"code": "import time; time.sleep(1.0); print('done')", "language": "python"}
        with ThreadPoolExecutor(4) as ex:
            futs = [
                ex.submit(httpx.post, url + "/run_code", json=payload, headers=AUTH, timeout=60)
                for _ in range(4)
            ]
            while httpx.get(url + "/health", timeout=5).json()["inflight"] < 4:
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):
                httpx.post(url + "/run_code", json=payload, headers=AUTH, timeout=5)
            answers = [f.result(60) for f in futs]
        assert [a.status_code for a in answers] == [200] * 4
        assert [a.json()["run_result"]["stdout"] for a in answers] == ["done\n"] * 4
        # uvicorn re-raises the signal once drained: the status says SIGTERM, as for any
        # process a SIGTERM ended, after every answer went out.
        assert proc.wait(30) in (0, -signal.SIGTERM)
        log = proc.stdout.read()
        access = [json.loads(x) for x in log.splitlines() if '"event": "access"' in x]
        assert sum(1 for x in access if x["path"] == "/run_code" and x["status"] == 200) == 4
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


HOSTILE: list[tuple[str, str, str]] = [
    ("python", "fork bomb",
     "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    ("python", "memory bomb", "x = []\nwhile True:\n    x.append(bytearray(1 << 20))"),
    ("python", "escaping daemon",
     "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
     "        time.sleep(600)\nprint('parent out')"),
    ("python", "output flood", "import sys\nwhile True:\n    sys.stdout.write('z' * 65536)"),
    ("python", "host secret", "print(open('{secret}').read())"),
    ("c", "fork bomb", "#include <unistd.h>\nint main(void) { for (;;) fork(); }"),
    ("cpp", "memory bomb",
     "#include <cstring>\nint main() { for (;;) { char *p = new char[1 << 20]; "
     "std::memset(p, 1, 1 << 20); } }"),
    ("cpp", "endless compile",
     "#define L0(x) x x\n#define L1(x) L0(L0(x))\n#define L2(x) L1(L1(x))\n"
     "#define L3(x) L2(L2(x))\n#define L4(x) L3(L3(x))\n#define L5(x) L4(L4(x))\n"
     "int main() { L5(;) }"),
    ("java", "memory bomb",
     "import java.util.*;\npublic class Main { public static void main(String[] a) {\n"
     "  List<long[]> l = new ArrayList<>(); while (true) l.add(new long[1 << 17]); } }"),
    ("nodejs", "memory bomb", "const a = []; for (;;) a.push(new Array(1e6).fill(1));"),
    ("bash", "fork bomb", "f() { f | f & }; f"),
    ("perl", "fork bomb", "fork while 1;"),
]  # fmt: skip


def _hostile_params() -> list[Any]:
    from agentrl.languages import ToolchainMissing, resolve_language

    out = []
    for language, name, code in HOSTILE:
        marks = []
        try:
            resolve_language(language)
        except ToolchainMissing as e:
            marks = [pytest.mark.skip(reason=str(e))]
        out.append(pytest.param(language, code, id=f"{language}-{name}", marks=marks))
    return out


@pytest.mark.parametrize(("language", "code"), _hostile_params())
def test_hostile_programs_are_contained_and_the_host_is_clean(
    language: str, code: str, http: Any
) -> None:
    secret = "SECRET-" + os.urandom(12).hex()
    path = Path("/root") / f"agentrl-secret-{secret[-12:]}"
    path.write_text(secret + "\n")
    try:
        t0 = time.monotonic()
        body = run_code(
            http,
            language=language,
            code=code.replace("{secret}", str(path)),
            compile_timeout=3,
            run_timeout=2,
            memory_limit_MB=256,
        )
        took = time.monotonic() - t0
    finally:
        path.unlink()
    assert body["status"] in ("Success", "Failed"), body  # never SandboxError
    assert secret not in json.dumps(body)
    assert took < 3 + 2 + 10 * TIME_SCALE, took  # bounded by its limits, never a hang
    cr = body["compile_result"]
    if cr is not None and (cr["status"] != "Finished" or cr["return_code"] != 0):
        assert body["status"] == "Failed" and body["run_result"] is None
    assert_host_clean(timeout=5 * TIME_SCALE)
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["inflight"] == 0


# --- fuzzing ---------------------------------------------------------------------------------


def test_openapi_fuzz_no_500s_no_hangs(server: ThreadServer) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=AUTH)

    def fuzz(op: Any) -> Any:
        @given(case=op.as_strategy())
        @settings(
            max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case: Any) -> None:
            t0 = time.monotonic()
            response = case.call(base_url=server.url, headers=AUTH, timeout=30)
            calls[0] += 1
            assert time.monotonic() - t0 < 30, "a request hung"
            case.validate_response(response, checks=[not_a_server_error])

        return check

    calls = [0]
    failures: list[str] = []
    ops = [op.ok() for op in schema.get_all_operations()]
    assert len(ops) >= 5
    for op in ops:
        t0 = time.monotonic()
        try:
            fuzz(op)()
        except Exception as e:  # collect every operation's failure
            failures.append(f"{op.method.upper()} {op.path}: {e}")
        print(f"fuzzed {op.method.upper()} {op.path} in {time.monotonic() - t0:.1f} s")
    assert not failures, "\n".join(failures)
    assert calls[0] >= 3 * len(ops), calls


def test_metrics_and_traces_of_the_served_pool(tmp_path: Path) -> None:
    """``/metrics`` counts the service's runs and requests (behind the token), and
    ``--traces`` records every run, found by ``agentrl traces search``."""
    from agentrl.observability.traces import search

    traces = tmp_path / "traces"
    config = ServiceConfig(token=TOKEN, workers=2, traces=str(traces))

    def served(text: str) -> float:  # the counter is the process's: other tests add to it
        m = re.search(
            r'^agentrl_http_requests_total\{code="200",method="POST",route="/run_code"\} (\S+)',
            text,
            re.M,
        )
        return float(m.group(1)) if m else 0.0

    with ThreadServer(config) as s, httpx.Client(base_url=s.url, headers=AUTH, timeout=60) as c:
        before = served(c.get("/metrics/").text)
        for i in range(3):
            assert run_code(c, code=f"print({i})", language="python")["status"] == "Success"
        for _ in range(2):
            r = run_code(c, code="while True: pass", language="python", run_timeout=0.5)
            assert r["run_result"]["status"] == "TimeLimitExceeded", r
        assert httpx.get(s.url + "/metrics/", timeout=10).status_code == 401
        text = c.get("/metrics/").text
    finished = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^agentrl_jobs_finished_total\{[^}]*pool="sandbox-server"[^}]*status="(\w+)"[^}]*\} (\S+)',
            text,
            re.M,
        )
    }
    assert finished.get("ok") == 3 and finished.get("timeout") == 2, text[:3000]
    assert served(text) - before == 5, text[-3000:]
    found = list(search(traces, "status:timeout"))
    assert len(found) == 2 and all(r["status"] == "timeout" for r in found), found
