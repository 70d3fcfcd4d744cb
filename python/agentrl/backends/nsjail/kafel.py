"""Seccomp: the native backend's policy compiled to Kafel, nsjail's policy language.

:func:`kafel_policy` compiles ``agentrl._core.seccomp_policy(network)``; :func:`_compiled_policy`
makes the nsjail at hand accept it (a call its Kafel does not know becomes ``SYSCALL[nr]`` or is
dropped, which only refuses more) and caches the result per binary.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping

from agentrl import _core
from agentrl.backends.nsjail.ids import _IDS, BOX_ID
from agentrl.errors import SandboxError

log = logging.getLogger("agentrl.nsjail")  # the logger name from before the move

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
