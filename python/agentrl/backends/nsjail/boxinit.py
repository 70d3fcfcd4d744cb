"""How a jail starts: the shell wrapper nsjail itself is started under (the run's v1 cgroup,
``RLIMIT_FSIZE`` and a 1-byte ``RLIMIT_CORE``) and the init that is pid 1 of every box."""

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
