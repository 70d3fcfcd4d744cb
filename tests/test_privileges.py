"""Without root or CAP_SYS_ADMIN, every way of making a box fails at once with the same one
line: what is missing, and where the deployment docs are.

The processes are real: one root process without CAP_SYS_ADMIN (``setpriv`` drops it from
the bounding set, so the interpreter starts without it) and one that drops to uid 65534
after loading agentrl (this machine's interpreter is not readable by other users).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import kernel_version

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test drops root's privileges")


OLD_KERNEL = kernel_version() < (5, 12)

DOCS = "https://github.com/agentrl/agentrl/blob/main/docs/deployment.md"

MAKE_BOXES = textwrap.dedent(
    """
    import os, sys
    import agentrl, agentrl.backends.nsjail, agentrl.sandbox.box
    from agentrl import Sandbox, SandboxError, SandboxPool
    if sys.argv[1] == "nobody":
        os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
    for make in (lambda: Sandbox(), lambda: Sandbox(warm=False),
                 lambda: Sandbox(backend="nsjail"), lambda: SandboxPool(workers=1)):
        try:
            make()
        except SandboxError as e:
            print("ERR", e)
        else:
            print("MADE A BOX")
    """
)


def _no_sys_admin(*argv: str) -> list[str]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("util-linux's setpriv is not installed")
    return [setpriv, "--bounding-set=-sys_admin", *argv]


@pytest.mark.skipif(not OLD_KERNEL, reason="needs a kernel older than 5.12 (.ci/guest's 5.10)")
def test_an_old_kernel_is_refused_at_once_naming_its_release() -> None:
    from agentrl import Sandbox, SandboxError

    with pytest.raises(SandboxError) as e:
        Sandbox()
    msg = str(e.value)
    assert f"needs Linux 5.12 or newer (this kernel is {os.uname().release})" in msg, msg
    assert DOCS in msg and "\n" not in msg, msg


@pytest.mark.skipif(OLD_KERNEL, reason="the kernel check comes first on this kernel")
@pytest.mark.parametrize("who", ["root-without-cap-sys-admin", "nobody"])
def test_every_constructor_fails_with_one_line_naming_what_is_missing(who: str) -> None:
    argv = [sys.executable, "-c", MAKE_BOXES, who]
    if who != "nobody":
        argv = _no_sys_admin(*argv)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4, out.stdout + out.stderr
    missing = "uid 65534, not root" if who == "nobody" else "root but lacks CAP_SYS_ADMIN"
    for line in lines:
        assert line.startswith("ERR "), line
        assert missing in line and DOCS in line, line
    assert len(set(lines)) == 1, "the same message from every backend"


@pytest.mark.skipif(OLD_KERNEL, reason="the kernel check comes first on this kernel")
def test_cli_prints_the_line_without_a_traceback() -> None:
    out = subprocess.run(
        _no_sys_admin(sys.executable, "-m", "agentrl", "run", "--", "/bin/true"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.splitlines()
    assert "lacks CAP_SYS_ADMIN" in line and DOCS in line, line
