"""The nsjail backend of :class:`agentrl.Sandbox` (:class:`NsjailBackend`): the facade's checked
arguments run through nsjail (see :mod:`agentrl.backends.nsjail` for how a run is built and what
nsjail cannot report)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from typing import NoReturn

from agentrl.backends.nsjail.binary import find_nsjail
from agentrl.backends.nsjail.boxinit import _INIT, _WRAPPER, _WRAPPER_NO_CG
from agentrl.backends.nsjail.cgroups import _Cgroups
from agentrl.backends.nsjail.files import (
    _DIR_FLAGS,
    _absolute_box_path,
    _collect,
    _relative_parts,
    _work_parent,
    _write_input,
)
from agentrl.backends.nsjail.ids import _IDS, BOX_ID
from agentrl.backends.nsjail.kafel import _compiled_policy
from agentrl.backends.nsjail.mounts import (
    _FORBIDDEN_TARGETS,
    WORK_DIR,
    _make_etc,
    _plan_mounts,
    _to_host,
)
from agentrl.backends.nsjail.runloop import _cannot, _Run, _watch
from agentrl.backends.nsjail.staging import _restage, _Staging
from agentrl.errors import SandboxError
from agentrl.sandbox.args import to_box_path
from agentrl.sandbox.backend import Options, RunRequest
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult, Status


def default_concurrency() -> int:
    """Slots of an nsjail sandbox without ``max_concurrency``: 2 per core, at least 4."""
    return max(4, 2 * (os.cpu_count() or 1))


class NsjailBackend:
    """:class:`~agentrl.sandbox.backend.Backend` through the nsjail binary ``nsjail`` (default:
    :func:`find_nsjail`). ``warm`` and ``preimports`` are ignored (nsjail has no warm
    interpreter: every ``run_python`` starts ``python __main__.py``); ``preload`` needs a warm
    interpreter and is refused."""

    def __init__(self, opts: Options, nsjail: str | None = None) -> None:
        if opts.preload:
            raise ValueError("preload needs the native backend's warm interpreters")
        self._limits = opts.limits
        self._network = opts.network
        python = opts.python
        env = dict(opts.env)
        max_concurrency = opts.max_concurrency
        bin_dir = os.path.dirname(os.path.realpath(sys.executable))
        base_env = {
            "PATH": f"{os.path.dirname(sys.executable)}:{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": WORK_DIR,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        base_env.update(env)
        self._env = base_env
        self._host_python = opts.host_python
        self._python = self._host_python
        bind_list = []
        for src, dst, rw in opts.binds:
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
            self._cgroups = _Cgroups.create(opts.cgroup_parent)
            if self._cgroups is None and not opts.degraded:
                raise SandboxError(
                    "no usable cgroup v1 (memory, pids, cpuacct) or v2 hierarchy for nsjail "
                    "boxes; pass degraded=True to accept rlimit-only enforcement"
                )
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self, _cleanup, self._owner, self._root, self._cgroups, None
            )
            self._etc = os.path.join(self._root, "etc")
            _make_etc(self._etc, self._network)
            (
                self._mount_args,
                self._mount_table,
                staged,
                self._symlinks,
                self._relocated,
            ) = _plan_mounts(bind_list, python, self._host_python, self._etc)
            self._python = self._in_box(self._host_python)
            if self._relocated and "PATH" not in env:
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

    # -- properties ----------------------------------------------------------------------

    @property
    def cgroup_version(self) -> str | None:
        """``"v1"`` or ``"v2"``: which cgroup hierarchy enforces memory and pids."""
        return self._cgroups.version if self._cgroups else None

    @property
    def python(self) -> str:
        return self._python

    @property
    def warm(self) -> bool:
        """Always False: nsjail boxes start a fresh interpreter for every ``run_python``."""
        return False

    @property
    def root(self) -> str:
        """The sandbox's directory on the host (the runs' work directories, ``/etc``)."""
        return self._root

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

    def run(self, req: RunRequest) -> ExecResult:
        """Runs ``req`` in a fresh nsjail box and returns its verdict (as
        :meth:`agentrl.Sandbox.run`; ``tee``, live output, needs the native backend)."""
        if req.tee is not None:
            raise ValueError("tee (live output) needs the native backend")
        args, data, names, cwd, limits = req.argv, req.stdin, req.collect, req.cwd, req.limits
        file_list = [(_relative_parts("files", name), content) for name, content in req.files]
        collect_list = [(n, _relative_parts("collect", n)) for n in names]
        lim = limits or self._limits
        if cwd is None:
            box_cwd = WORK_DIR
        elif cwd.startswith("/"):
            box_cwd = _absolute_box_path("cwd", cwd)
        else:
            box_cwd = WORK_DIR + "/" + "/".join(_relative_parts("cwd", cwd))
        run_env = dict(self._env)
        for k, v in req.env:
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

    def run_python(self, req: RunRequest) -> ExecResult:
        """Runs ``req`` cold (``python __main__.py`` in /work). ``pass_fds`` needs the native
        backend's warm interpreters: any fd is refused, as is ``tee``."""
        if req.pass_fds:
            raise ValueError("pass_fds needs the native backend (warm runs)")
        return self.run(req)

    def warm_for(self, env: Sequence[tuple[str, str]], pass_fds: bool) -> bool:
        """Always False: no warm interpreters."""
        return False

    def session(self, files: list[tuple[str, bytes]], disk_bytes: int) -> NoReturn:
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
            host = _to_host(box, table, self._symlinks)
            if host and os.path.isfile(host) and os.access(host, os.X_OK):
                return os.fsencode(box)
        return None

    def _in_box(self, host: str) -> str:
        """Where host path ``host`` (of the interpreter's installation) is seen in the box."""
        return to_box_path(host, self._relocated)

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
            return _watch(
                proc, started, stdin, lim, run, argv, in_w, out_r, err_r, log_r, st_r, fds
            )
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, cancel: bool) -> None:
        """Waits for runs in flight (unless ``cancel``: at interpreter exit, where they are
        not waited for), then removes the cgroups, the staging namespace and the sandbox's
        directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._in_flight and not cancel:
                self._idle.wait()
        self._finalizer()

    def describe(self) -> str:
        return f" nsjail={self._nsjail}"


def _replace(r: ExecResult, **changes: object) -> ExecResult:
    return dataclasses.replace(r, **changes)  # type: ignore[arg-type]


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
