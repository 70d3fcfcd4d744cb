"""Fidelity corpus: ordinary programs run on the host and through both paths of the sandbox.

Each entry of :data:`CORPUS` is a small, deterministic, ordinary program (stdlib, threads,
every multiprocessing start method, asyncio, loopback servers, ssl, ptys, sqlite, numpy,
signals, subprocesses, C/C++ with AddressSanitizer, node, Java, shell with coreutils, make,
/proc and the environment). It runs once on the host, as a user would run it from a shell,
and then through the **cold** path (``Sandbox(warm=False)``: ``run_python`` or ``run``) and
the **warm** path (``Sandbox()``: ``run_python``; a command line goes through a tiny
``run_python`` driver that runs it with ``subprocess`` and forwards its exit status, its
stdio being inherited). Every (entry, path) pair is one pytest item; exit status, stdout and
stderr must be equal after :func:`normalise`.

The host run is made comparable, not identical by construction: it runs in a fresh directory
on a tmpfs (``/dev/shm``, as the box's ``/work`` is a tmpfs) holding the same files, with the
environment the box gives (``PATH`` of the interpreter's ``bin`` dirs and the system's,
``HOME`` = the work dir, ``TMPDIR=/tmp``, ``LANG=C.UTF-8``, ``USER=sandbox``,
``PYTHONDONTWRITEBYTECODE=1``), stdin a pipe, stdout and stderr pipes. A Python entry runs as
``python __main__.py`` there, the name ``run_python`` gives it in the box.

What :func:`normalise` rewrites (never the thing under test): the host work dir -> ``/work``;
the host venv (``sys.prefix``) and the box's ``/.agentrl/py/N`` -> ``<PY>``; hex addresses
``0x...`` (6+ digits); sanitizer pids ``==N==``. An entry adds its own rules for what it cannot avoid
printing (ls owner columns: the box user is uid 1000 ``sandbox``, the host user root;
durations of test runners). Ports, pids, times and hostnames are kept out of the programs'
output instead.

A difference that is known lies in :data:`KNOWN_DIFFERENCES` (entry, path, reason), marked
``xfail(strict=True)``: when the difference is fixed the item XPASSes, which fails the run,
and the entry must leave the table (and ``tests/fidelity/DIFFERENCES.md``).

See every diff: ``pytest tests/test_fidelity.py -rxX --runxfail -q`` (each failure carries a
unified diff of the normalised host and box outputs).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from agentrl import ExecResult, Limits, Sandbox

LIMITS = Limits(
    wall_time_s=60.0,
    cpu_time_s=30.0,
    memory_bytes=1 << 30,
    max_pids=256,
    max_output_bytes=4 << 20,
    max_file_bytes=64 << 20,
    max_open_files=256,
    tmpfs_bytes=256 << 20,
)
HOST_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Entry:
    """One program of the corpus."""

    name: str
    python: str | None = None
    """Source of ``__main__.py`` (a Python entry)."""
    sh: str | None = None
    """A command line for ``sh -c`` (a command entry)."""
    files: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
    stdin: bytes = b""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    needs: tuple[str, ...] = ()
    """Host tools the entry needs; it is skipped where one is missing."""
    norm: tuple[tuple[str, str], ...] = ()
    """Extra (regex, replacement) rules, for output the program cannot avoid."""


def py(name: str, source: str, **kw: object) -> Entry:
    return Entry(name, python=textwrap.dedent(source).lstrip("\n"), **kw)  # type: ignore[arg-type]


def sh(name: str, cmd: str, **kw: object) -> Entry:
    return Entry(name, sh=textwrap.dedent(cmd).strip("\n"), **kw)  # type: ignore[arg-type]


def d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


OWNER = (r"\b(root|sandbox) +(root|sandbox)\b", "USER GROUP")
"""ls owner and group columns: root on the host, ``sandbox`` (uid 1000) in the box."""

# --------------------------------------------------------------------------- pure stdlib

STDLIB = [
    py(
        "json",
        r"""
        import json
        data = {"b": [1, 2.5, None, True], "a": {"x": "é ünicode", "y": [{"z": 1e100}]}, "c": "l\nb"}
        s = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False)
        print(s)
        print(json.loads(s) == data, json.dumps(data, separators=(",", ":"), sort_keys=True))
        try:
            json.loads("{bad json}")
        except json.JSONDecodeError as e:
            print("error:", e)
        """,
    ),
    py(
        "re",
        r"""
        import re
        text = "alice=30, bob=25; carol=41 | dave=x"
        for m in re.finditer(r"(?P<name>[a-z]+)=(?P<age>\d+)", text):
            print(m.group("name"), int(m.group("age")), m.span())
        print(re.sub(r"(\w+)=(\d+)", r"\2:\1", text))
        print(re.split(r"[,;|]\s*", text), re.findall(r"(?i)B\w+", text))
        print(re.fullmatch(r"\d{3}-\d{4}", "555-1234") is not None)
        print(re.compile(r"^\s*(\w+)\s*$", re.M).findall("  one\ntwo  \n three four\n"))
        """,
    ),
    py(
        "decimal_fractions",
        r"""
        from decimal import ROUND_HALF_EVEN, Decimal, getcontext
        from fractions import Fraction
        getcontext().prec = 50
        print(Decimal(1) / Decimal(7), Decimal(2).sqrt())
        print(Decimal("1.005").quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))
        print(sum(Fraction(1, n) for n in range(1, 21)))
        print(Fraction(3.75), Fraction("22/7") - Fraction(355, 113))
        print(float(Fraction(1, 3)), (0.1 + 0.2).hex(), repr(0.1 + 0.2))
        """,
    ),
    py(
        "datetime_zoneinfo",
        r"""
        import calendar, time
        import datetime as dt
        from zoneinfo import ZoneInfo
        d = dt.datetime(2024, 2, 29, 13, 45, 30, 123456)
        print(d.isoformat(), d.strftime("%A %d %B %Y %j %U %H:%M:%S.%f"))
        print(d + dt.timedelta(days=366, hours=-5), (dt.date(2030, 1, 1) - dt.date(2000, 1, 1)).days)
        u = dt.datetime(2024, 3, 31, 0, 30, tzinfo=dt.timezone.utc)
        for tz in ("Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"):
            print(tz, u.astimezone(ZoneInfo(tz)).isoformat(), u.astimezone(ZoneInfo(tz)).tzname())
        print(dt.datetime.fromtimestamp(1700000000, dt.timezone.utc))
        print(dt.datetime.strptime("2021-07-04 12:00", "%Y-%m-%d %H:%M"))
        print(calendar.month(2024, 2))
        print(calendar.isleap(2100), dt.date(2024, 12, 30).isocalendar())
        print(time.tzname, time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(86400 * 365)))
        """,
    ),
    py(
        "collections_itertools",
        r"""
        import collections, functools, itertools, operator
        c = collections.Counter("mississippi abracadabra")
        print(sorted(c.items()), c.most_common(3))
        dq = collections.deque(range(10), maxlen=5)
        dq.rotate(2)
        print(dq)
        od = collections.OrderedDict.fromkeys("zyx")
        od.move_to_end("z")
        print(list(od))
        dd = collections.defaultdict(list)
        for k, v in [("a", 1), ("b", 2), ("a", 3)]:
            dd[k].append(v)
        print(dict(dd))
        P = collections.namedtuple("P", "x y")
        print(P(1, 2)._replace(y=5), P._fields, collections.ChainMap({"a": 1}, {"b": 3})["b"])
        print(list(itertools.permutations("abc", 2)))
        print(list(itertools.combinations_with_replacement(range(3), 2)))
        print(list(itertools.islice(itertools.cycle("xy"), 5)))
        print(list(itertools.accumulate([1, 2, 3, 4], operator.mul)))
        print([(k, list(g)) for k, g in itertools.groupby(sorted("aabbbcd"))])
        print(list(itertools.pairwise(range(5))), list(itertools.zip_longest("ab", "wxyz", fillvalue="-")))
        print(functools.reduce(operator.add, range(101)))
        """,
    ),
    py(
        "dataclasses_typing_enum",
        r"""
        import dataclasses, enum, typing

        class Color(enum.Enum):
            RED = 1
            GREEN = 2

        class Perm(enum.IntFlag):
            R = 4
            W = 2
            X = 1

        @dataclasses.dataclass(order=True, frozen=True)
        class Item:
            name: str
            qty: int = 0
            tags: tuple[str, ...] = ()

        T = typing.TypeVar("T")

        class Box(typing.Generic[T]):
            def __init__(self, v: T) -> None:
                self.v = v

        def f(x: int, y: "list[str] | None" = None) -> dict[str, int]:
            return {}

        print(sorted([Item("b", 2), Item("a", 5), Item("a", 1)]))
        print(dataclasses.asdict(Item("x", 1, ("t",))), dataclasses.fields(Item)[1])
        try:
            Item("a").qty = 3
        except dataclasses.FrozenInstanceError as e:
            print(type(e).__name__, e)
        print(list(Color), Color(2), Color["RED"].value, Perm.R | Perm.W, Perm(7))
        print(typing.get_type_hints(f), typing.get_origin(list[int]), typing.get_args(dict[str, int]))
        print(Box[int](3).v, typing.Optional[int], typing.Literal["a", "b"])
        """,
    ),
    py(
        "text_unicode",
        r"""
        import string, textwrap, unicodedata
        s = "The quick brown fox jumps over the lazy dog. " * 4
        print(textwrap.fill(s, width=30, initial_indent="> ", subsequent_indent="  "))
        print(textwrap.shorten(s, 40), textwrap.indent("a\nb\n", "| "), sep="\n")
        for ch in "aÅ€日😀\u0301":
            print(ascii(ch), unicodedata.name(ch, "?"), unicodedata.category(ch),
                  unicodedata.east_asian_width(ch), ch)
        print(unicodedata.normalize("NFD", "Åé").encode(), unicodedata.normalize("NFKC", "ﬁ①"))
        print(unicodedata.unidata_version, "straße".upper(), "ǅ".lower(), "İ".casefold().encode())
        print(string.Template("$a-${b}").substitute(a=1, b=2))
        print("%-8s|%8.3f|%x|%o|%e" % ("ab", 3.14159, 255, 8, 12345.678))
        print(f"{1234567.891:,.2f} {0.25:%} {42:#010b}")
        """,
    ),
    py(
        "hashlib_hmac",
        r"""
        import hashlib, hmac
        data = b"The quick brown fox jumps over the lazy dog"
        for name in ("md5", "sha1", "sha256", "sha512", "sha3_256", "blake2b", "blake2s"):
            print(name, hashlib.new(name, data).hexdigest())
        print(hashlib.shake_128(data).hexdigest(16))
        print(hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 1000).hex())
        print(hmac.new(b"key", data, "sha256").hexdigest(), hmac.compare_digest(b"a", b"a"))
        print(hashlib.scrypt(b"pw", salt=b"salt", n=16, r=8, p=1).hex())
        print(sorted(hashlib.algorithms_guaranteed))
        """,
    ),
    py(
        "compression",
        r"""
        import bz2, gzip, io, lzma, tarfile, zipfile, zlib
        data = ("".join(chr(97 + (i * 7) % 26) for i in range(5000)) * 4).encode()
        for name, mod in (("zlib", zlib), ("bz2", bz2), ("lzma", lzma)):
            c = mod.compress(data)
            print(name, len(c), mod.decompress(c) == data)
        print("crc32", zlib.crc32(data), "adler32", zlib.adler32(data))
        with gzip.GzipFile("x.gz", "wb", mtime=0) as f:
            f.write(data)
        raw = open("x.gz", "rb").read()
        print("gzip", len(raw), raw[:10].hex(), gzip.decompress(raw) == data)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(zipfile.ZipInfo("a.txt", (2020, 1, 1, 0, 0, 0)), data)
        print("zip", len(buf.getvalue()), zipfile.ZipFile(buf).namelist())
        with tarfile.open("t.tar", "w") as t:
            ti = tarfile.TarInfo("member.txt")
            ti.size, ti.mtime = len(data), 0
            t.addfile(ti, io.BytesIO(data))
            t.add("x.gz")
        with tarfile.open("t.tar") as t:
            print([(m.name, m.size, m.isfile()) for m in t.getmembers()])
        """,
    ),
    py(
        "base64_struct",
        r"""
        import array, base64, binascii, struct, sys
        b = bytes(range(0, 256, 7))
        print(base64.b64encode(b).decode(), base64.urlsafe_b64encode(b"\xff\xfe?").decode())
        print(base64.b32encode(b"hello").decode(), base64.a85encode(b"hello"))
        print(binascii.hexlify(b, "-", 4), base64.b16decode("DEADBEEF"))
        fmt = "<IhqdI?5s"
        p = struct.pack(fmt, 1, -2, 1 << 40, 2.5, 0xDEADBEEF, True, b"ab")
        print(p.hex(), struct.calcsize(fmt), struct.unpack(fmt, p), struct.calcsize("@ic"))
        a = array.array("i", range(5))
        a.byteswap()
        print(a.tobytes().hex(), sys.byteorder)
        print(int.from_bytes(b"\x01\x02", "big"), (1025).to_bytes(4, "little"))
        """,
    ),
    py(
        "csv",
        r"""
        import csv, io
        rows = [["name", "qty", "note"], ["apple", "3", 'says "hi"'], ["pear, green", "10", "multi\nline"]]
        with open("data.csv", "w", newline="") as f:
            csv.writer(f).writerows(rows)
        print(open("data.csv", newline="").read().encode())
        with open("data.csv", newline="") as f:
            for r in csv.DictReader(f):
                print(dict(r))
        out = io.StringIO()
        w = csv.DictWriter(out, ["a", "b"], quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
        w.writeheader()
        w.writerow({"a": 1, "b": "x"})
        print(out.getvalue())
        print(csv.Sniffer().sniff("a;b;c\n1;2;3\n").delimiter, list(csv.reader(["x\ty"], dialect="excel-tab")))
        """,
    ),
    py(
        "argparse",
        r"""
        import argparse
        p = argparse.ArgumentParser(description="A demo tool.", epilog="bye")
        p.add_argument("files", nargs="*")
        p.add_argument("-n", "--count", type=int, default=3, help="how many")
        p.add_argument("--mode", choices=["a", "b"], default="a")
        p.add_argument("-v", action="count", default=0)
        sub = p.add_subparsers(dest="cmd")
        sub.add_parser("go").add_argument("--fast", action="store_true")
        print(p.parse_args(["-vv", "-n", "5", "x", "y"]))
        print(p.parse_args(["go", "--fast"]))
        p.print_help()
        p.parse_args(["--mode", "c"])
        """,
    ),
    py(
        "logging_warnings",
        r"""
        import logging, sys, warnings
        logging.basicConfig(level=logging.DEBUG,
                            format="%(levelname)s:%(name)s:%(funcName)s:%(lineno)d:%(message)s")
        log = logging.getLogger("demo")

        def work():
            log.debug("debug %d", 1)
            log.info("info")
            log.warning("warn %s", "x")

        work()
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("failed")
        logging.getLogger("demo.child").error("child")
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("OUT %(levelname)s %(message)s"))
        log.addHandler(h)
        log.critical("both")
        warnings.warn("careful", UserWarning)
        warnings.warn("old", DeprecationWarning)
        print("done")
        """,
    ),
    py(
        "pathlib_os_files",
        r"""
        import os, pathlib, shutil, stat
        print(oct(os.umask(0o022)))
        w = pathlib.Path.cwd()
        print(w, sorted(os.listdir(".")))
        (w / "d/e").mkdir(parents=True)
        (w / "d/a.txt").write_text("alpha\n")
        (w / "d/e/b.bin").write_bytes(bytes(range(10)))
        os.symlink("a.txt", w / "d/link")
        print(sorted(str(p.relative_to(w)) for p in w.rglob("*")))
        print((w / "d/link").resolve(), (w / "d/link").read_text(), os.readlink("d/link"))
        st = os.stat("d/e/b.bin")
        print(st.st_size, stat.S_ISREG(st.st_mode), oct(st.st_mode & 0o777), st.st_nlink)
        os.rename("d/a.txt", "d/c.txt")
        print(sorted(os.listdir("d")), os.path.exists("d/link"), os.path.lexists("d/link"))
        t = pathlib.Path("/tmp") / "fidelity-pathlib-probe"
        t.mkdir(exist_ok=True)
        (t / "f").write_text("x" * 1000)
        print((t / "f").stat().st_size, os.access(t / "f", os.W_OK))
        shutil.rmtree(t)
        print(t.exists())
        fd = os.open("mode.txt", os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        print(oct(os.stat("mode.txt").st_mode & 0o777), oct(stat.S_IMODE(os.stat(".").st_mode)))
        print(pathlib.Path("a/b/../c.tar.gz").suffixes, pathlib.PurePosixPath("/x/y").parts)
        print(os.path.realpath("d/../d/e"), os.path.relpath("/usr/bin", "/usr/lib"))
        """,
    ),
    py(
        "tempfile_shutil_glob",
        r"""
        import glob, os, shutil, tempfile
        with tempfile.TemporaryDirectory() as d:
            print(os.path.dirname(d) == tempfile.gettempdir(), tempfile.gettempdir())
            for n in ("b.py", "a.py", "c.txt", "sub/d.py"):
                os.makedirs(os.path.join(d, os.path.dirname(n)), exist_ok=True)
                with open(os.path.join(d, n), "w") as f:
                    f.write(n)
            print(sorted(os.path.relpath(p, d) for p in glob.glob(d + "/**/*.py", recursive=True)))
            shutil.copytree(d, "copy")
            shutil.make_archive("arch", "zip", "copy")
            print(sorted(glob.glob("copy/*")), os.path.getsize("arch.zip") > 0)
            shutil.move("copy/c.txt", "moved.txt")
            print(open("moved.txt").read(), shutil.disk_usage(".").total > 0)
        with tempfile.NamedTemporaryFile("w+", suffix=".txt") as f:
            f.write("hello")
            f.flush()
            f.seek(0)
            print(f.read(), f.name.endswith(".txt"), os.path.dirname(f.name))
        fd, p = tempfile.mkstemp(dir=".")
        os.close(fd)
        print(os.path.dirname(os.path.abspath(p)) == os.getcwd())
        print(shutil.which("sh"), shutil.which("python"), shutil.which("gcc"))
        """,
    ),
    py(
        "locale_encodings",
        r"""
        import codecs, locale, sys
        print(sys.getfilesystemencoding(), sys.stdout.encoding, sys.stderr.encoding,
              sys.stdin.encoding, sys.stdout.errors, sys.stderr.errors)
        print(locale.getpreferredencoding(False), locale.setlocale(locale.LC_ALL, ""), locale.getlocale())
        print(locale.localeconv()["decimal_point"], locale.nl_langinfo(locale.CODESET))
        print("héllo wörld €".encode("cp1252"), "日本".encode("shift_jis"), codecs.decode(b"\xe9t\xe9", "latin-1"))
        print("x\udcff".encode("utf-8", "surrogateescape"), b"\xff".decode("utf-8", "replace"))
        try:
            locale.setlocale(locale.LC_ALL, "de_DE.UTF-8")
            print("de ok")
        except locale.Error as e:
            print("locale error:", e)
        print("日本語 ✓")
        """,
    ),
    py(
        "random_statistics_math",
        r"""
        import math, random, statistics
        r = random.Random(12345)
        xs = [r.gauss(10, 3) for _ in range(1000)]
        print(round(statistics.mean(xs), 10), round(statistics.stdev(xs), 10))
        print(statistics.median([r.randint(0, 100) for _ in range(51)]))
        print(r.sample(range(100), 5), r.choice("abcdef"), r.random(), r.getrandbits(64))
        lst = list(range(10))
        r.shuffle(lst)
        print(lst)
        random.seed(7)
        print(random.random(), random.randrange(10**20))
        print(statistics.quantiles([1, 2, 3, 4, 5, 6, 7, 8], n=4), statistics.mode("aabbbc"))
        print(statistics.correlation([1, 2, 3], [2, 4, 7]))
        print(math.factorial(30), math.comb(50, 25), math.gcd(2**40, 6**20), math.isqrt(10**30 + 1))
        print(math.pi, math.e, math.inf, math.nan, math.lgamma(10.5), math.erf(0.5), math.fsum([0.1] * 10))
        print(math.sin(1e22), math.log(2**1000), math.hypot(3, 4, 12), math.nextafter(1.0, 2.0))
        """,
    ),
    py(
        "pickle_copy_heapq",
        r"""
        import bisect, copy, functools, heapq, pickle, weakref

        class Node:
            def __init__(self, v, kids=()):
                self.v, self.kids = v, list(kids)

            def __repr__(self):
                return f"Node({self.v}, {self.kids})"

        t = Node(1, [Node(2), Node(3, [Node(4)])])
        print(pickle.loads(pickle.dumps(t, protocol=5)), copy.deepcopy(t))
        print(pickle.dumps({"a": (1, 2.0, "x", b"y", None)}, protocol=2).hex())
        h = [5, 1, 8, 3, 9, 2]
        heapq.heapify(h)
        print([heapq.heappop(h) for _ in range(3)], heapq.nlargest(2, [4, 7, 1]))
        a = [1, 3, 3, 7]
        bisect.insort(a, 4)
        print(a, bisect.bisect_left(a, 3), bisect.bisect_right(a, 3))

        @functools.lru_cache(maxsize=None)
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)

        print(fib(200), fib.cache_info())
        r = weakref.ref(t)
        del t
        print(r())
        """,
    ),
    py(
        "stdin_text",
        r"""
        import sys
        data = sys.stdin.read()
        lines = data.splitlines()
        print(len(data), len(lines), sorted(set(data.split())))
        for i, line in enumerate(reversed(lines)):
            print(i, line.upper())
        print(repr(sys.stdin.read()), sys.stdin.isatty())
        """,
        stdin="banana apple\ncherry\n\nünicode line\nlast".encode(),
    ),
    py(
        "stdin_binary",
        r"""
        import hashlib, sys
        data = sys.stdin.buffer.read()
        print(len(data), hashlib.sha256(data).hexdigest(), data[:8])
        sys.stdout.buffer.write(data[::-1][:16] + b"\n")
        """,
        stdin=bytes(range(256)) * 64,
    ),
    py(
        "stdio_kinds",
        r"""
        import os, stat, sys
        for fd in (0, 1, 2):
            m = os.fstat(fd).st_mode
            kind = [n for n in ("S_ISFIFO", "S_ISREG", "S_ISCHR", "S_ISSOCK") if getattr(stat, n)(m)]
            print(fd, kind, os.isatty(fd), os.get_blocking(fd))
        print(sys.stdout.line_buffering, sys.stdin.read() == "")
        """,
    ),
    py(
        "import_local_module",
        r"""
        import helper
        from pkg import mod
        print(helper.greet("world"), helper.VALUE, mod.X)
        print(helper.__file__, mod.__name__)
        """,
        files={
            "helper.py": "def greet(n):\n    return f'hello {n}'\n\nVALUE = 42\n",
            "pkg/__init__.py": "",
            "pkg/mod.py": "X = 'pkg.mod'\n",
        },
    ),
    py(
        "env_pythonhashseed",
        r"""
        import os, sys
        print(os.environ.get("PYTHONHASHSEED"), sys.flags.hash_randomization)
        print(hash("fidelity"), hash(("a", 1)), list({"x", "y", "z", "w", "v"}))
        """,
        env={"PYTHONHASHSEED": "0"},
    ),
    py(
        "os_environ_argv",
        r"""
        import os, sys
        for k in sorted(os.environ):
            print(k, "=", os.environ[k])
        print(os.getcwd(), os.path.expanduser("~"), sys.argv, __name__, __file__)
        print(sys.prefix != sys.base_prefix, sys.executable, sys.path[0])
        """,
    ),
    py(
        "sys_flags",
        r"""
        import sys
        print(sys.version_info[:2], sys.platform, sys.implementation.name)
        print(sys.flags)
        print(sys.getrecursionlimit(), sys.getdefaultencoding(), sys.dont_write_bytecode)
        """,
    ),
    py(
        "unittest_runner",
        r"""
        import unittest

        class T(unittest.TestCase):
            def test_ok(self):
                self.assertEqual(1 + 1, 2)

            def test_fail(self):
                self.assertEqual([1, 2], [1, 3])

            @unittest.skip("why not")
            def test_skip(self):
                pass

            def test_err(self):
                {}["k"]

        unittest.main(verbosity=2)
        """,
        norm=((r"in \d+\.\d+s", "in N.NNNs"),),
    ),
    py(
        "atexit_os_exit",
        r"""
        import atexit, os, sys
        atexit.register(lambda: print("atexit ran", flush=True))
        print("kept", flush=True)
        if os.fork() == 0:
            print("lost in child")
            os._exit(5)
        _, st = os.wait()
        print("child", os.waitstatus_to_exitcode(st))
        sys.exit(0)
        """,
    ),
]

# --------------------------------------------------------------------------- exceptions

EXCEPTIONS = [
    py(
        "exc_uncaught",
        r"""
        def a(x):
            return b(x) + 1

        def b(x):
            return {"k": 1}[x]

        print("before", flush=True)
        a("missing")
        """,
    ),
    py(
        "exc_chained",
        r"""
        class AppError(Exception):
            pass

        def load():
            try:
                int("abc")
            except ValueError as e:
                raise AppError("bad config") from e

        try:
            load()
        except AppError:
            try:
                [][1]
            except IndexError:
                raise RuntimeError("while handling")
        """,
    ),
    py(
        "exc_group",
        r"""
        try:
            raise ExceptionGroup("many", [ValueError("v"), TypeError("t")])
        except* ValueError as eg:
            print("caught", eg.exceptions)
        raise ExceptionGroup("outer", [KeyError("k"), ExceptionGroup("inner", [OSError(2, "nope")])])
        """,
    ),
    py("exc_syntax_error", "x = 1\nprint(x\nif True:\n    pass\n"),
    py("exc_indentation_error", "def f():\nreturn 1\n"),
    py(
        "exc_recursion",
        r"""
        def f(n):
            return f(n + 1)

        f(0)
        """,
    ),
    py("sys_exit_code", "import sys\nprint('out')\nsys.exit(3)\n"),
    py("sys_exit_string", "import sys\nsys.exit('fatal: bye')\n"),
    py(
        "sys_exit_none_in_finally",
        "import sys\ntry:\n    sys.exit(None)\nfinally:\n    print('finally')\n",
    ),
]

# --------------------------------------------------------------------------- threads

THREADS = [
    py(
        "threading",
        r"""
        import queue, threading
        results, lock = [], threading.Lock()
        barrier = threading.Barrier(4)

        def worker(i):
            barrier.wait()
            with lock:
                results.append(i * i)

        ts = [threading.Thread(target=worker, args=(i,), name=f"w{i}") for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print(sorted(results), threading.active_count(), threading.current_thread().name)
        q = queue.Queue()

        def prod():
            for i in range(5):
                q.put(i)
            q.put(None)

        threading.Thread(target=prod).start()
        out = []
        while (v := q.get()) is not None:
            out.append(v)
        print(out)
        ev = threading.Event()
        threading.Timer(0.05, ev.set).start()
        print(ev.wait(5))

        def boom():
            raise ValueError("in thread")

        t = threading.Thread(target=boom, name="boomer")
        t.start()
        t.join()
        local = threading.local()
        local.x = 1
        t = threading.Thread(target=lambda: print("local in thread:", hasattr(local, "x")))
        t.start()
        t.join()
        """,
    ),
    py(
        "thread_pool",
        r"""
        import hashlib
        from concurrent.futures import ThreadPoolExecutor, as_completed

        def h(i):
            return i, hashlib.sha256(str(i).encode() * 10000).hexdigest()[:12]

        with ThreadPoolExecutor(max_workers=4) as ex:
            print(list(ex.map(h, range(8))))
            futs = [ex.submit(pow, 2, i) for i in range(10)]
            print(sorted(f.result() for f in as_completed(futs)))
            f = ex.submit(int, "x")
            print(type(f.exception()).__name__, f.exception())
        """,
    ),
    py(
        "process_pool_all_methods",
        r"""
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        def sq(x):
            return x * x

        def fail(x):
            raise ValueError(f"bad {x}")

        if __name__ == "__main__":
            for method in ("fork", "spawn", "forkserver"):
                with ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context(method)) as ex:
                    print(method, list(ex.map(sq, range(6))))
                    try:
                        ex.submit(fail, 3).result()
                    except ValueError as e:
                        print(method, "raised", e)
        """,
    ),
]

# --------------------------------------------------------------------------- multiprocessing

MP_TEMPLATE = r"""
import multiprocessing as mp
import sys

METHOD = "@METHOD@"


def child(q, i):
    q.put(i * 10)


def bump(lock, val, arr, i):
    with lock:
        val.value += i
    arr[i] = i * 1.5


def exit_with(code):
    sys.exit(code)


def crash():
    raise RuntimeError("child crashed")


def main():
    ctx = mp.get_context(METHOD)
    print(mp.get_start_method(), ctx.get_start_method())
    q = ctx.Queue()
    ps = [ctx.Process(target=child, args=(q, i)) for i in range(3)]
    for p in ps:
        p.start()
    got = sorted(q.get(timeout=30) for _ in ps)
    for p in ps:
        p.join()
    print(METHOD, got, [p.exitcode for p in ps])
    with ctx.Pool(2) as pool:
        print(METHOD, pool.map(abs, range(-3, 3)), pool.apply(divmod, (17, 5)))
    p = ctx.Process(target=exit_with, args=(7,))
    p.start()
    p.join()
    print(METHOD, "exitcode", p.exitcode)
    lock, val, arr = ctx.Lock(), ctx.Value("i", 0), ctx.Array("d", 3)
    ps = [ctx.Process(target=bump, args=(lock, val, arr, i)) for i in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    print(METHOD, val.value, list(arr))
    a, b = ctx.Pipe()
    a.send({"x": [1, 2]})
    print(METHOD, b.recv())
    sys.stdout.flush()
    p = ctx.Process(target=crash, name="crasher")
    p.start()
    p.join()
    print(METHOD, "crash exitcode", p.exitcode)


if __name__ == "__main__":
    main()
"""

MULTIPROCESSING = [
    *(py(f"mp_{m}", MP_TEMPLATE.replace("@METHOD@", m)) for m in ("fork", "spawn", "forkserver")),
    py(
        "mp_shared_memory",
        r"""
        import multiprocessing as mp
        from multiprocessing import shared_memory

        def fill(name, n):
            shm = shared_memory.SharedMemory(name=name)
            shm.buf[:n] = bytes(range(n))
            shm.close()

        def inc(name):
            sl = shared_memory.ShareableList(name=name)
            sl[0] += 1
            sl[1] = "changed"
            sl.shm.close()

        if __name__ == "__main__":
            for method in ("fork", "spawn", "forkserver"):
                ctx = mp.get_context(method)
                shm = shared_memory.SharedMemory(create=True, size=64)
                p = ctx.Process(target=fill, args=(shm.name, 16))
                p.start()
                p.join()
                print(method, bytes(shm.buf[:16]).hex(), p.exitcode)
                shm.close()
                shm.unlink()
                sl = shared_memory.ShareableList([41, "original", 2.5])
                p = ctx.Process(target=inc, args=(sl.shm.name,))
                p.start()
                p.join()
                print(method, list(sl))
                sl.shm.close()
                sl.shm.unlink()
        """,
    ),
    py(
        "mp_manager",
        r"""
        import multiprocessing as mp

        def work(d, lst, i):
            d[i] = i * i
            lst.append(i)

        if __name__ == "__main__":
            for method in ("fork", "spawn", "forkserver"):
                ctx = mp.get_context(method)
                with ctx.Manager() as m:
                    d, lst = m.dict(), m.list()
                    ps = [ctx.Process(target=work, args=(d, lst, i)) for i in range(3)]
                    for p in ps:
                        p.start()
                    for p in ps:
                        p.join()
                    print(method, sorted(d.items()), sorted(lst))
        """,
    ),
]

# --------------------------------------------------------------------------- asyncio

ASYNCIO = [
    py(
        "asyncio_gather",
        r"""
        import asyncio

        async def job(i, d):
            await asyncio.sleep(d)
            return i

        async def main():
            print(await asyncio.gather(*(job(i, (5 - i) * 0.01) for i in range(5))))
            done = []

            async def rec(i):
                await asyncio.sleep(i * 0.03)
                done.append(i)

            await asyncio.wait([asyncio.create_task(rec(i)) for i in (3, 1, 2)])
            print(done)
            try:
                await asyncio.wait_for(asyncio.sleep(10), 0.05)
            except asyncio.TimeoutError:
                print("timeout")
            q = asyncio.Queue()

            async def prod():
                for i in range(3):
                    await q.put(i)
                await q.put(None)

            asyncio.create_task(prod())
            while (v := await q.get()) is not None:
                print("got", v)
            print(await asyncio.gather(asyncio.sleep(0, "ok"), asyncio.to_thread(sum, [1, 2, 3])))
            async with asyncio.TaskGroup() as tg:
                t = tg.create_task(job("tg", 0))
            print(t.result())

        asyncio.run(main())
        """,
    ),
    py(
        "asyncio_subprocess",
        r"""
        import asyncio, sys
        PIPE = asyncio.subprocess.PIPE

        async def main():
            code = "import sys; print(sys.stdin.read().upper()); print('err', file=sys.stderr); sys.exit(4)"
            p = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdin=PIPE, stdout=PIPE, stderr=PIPE)
            out, err = await p.communicate(b"hello async")
            print(out, err, p.returncode)
            p = await asyncio.create_subprocess_shell("echo shell; ls / >/dev/null; exit 2", stdout=PIPE)
            print(await p.stdout.read(), await p.wait())
            procs = [await asyncio.create_subprocess_exec("sh", "-c", f"sleep 0.0{i}; echo {i}", stdout=PIPE)
                     for i in range(3)]
            print(sorted([(await p.communicate())[0] for p in procs]))
            p = await asyncio.create_subprocess_exec("sleep", "10")
            p.terminate()
            print(await p.wait())

        asyncio.run(main())
        """,
    ),
    py(
        "asyncio_tcp",
        r"""
        import asyncio

        handled = None

        async def handle(r, w):
            while line := await r.readline():
                w.write(line.upper())
                await w.drain()
            w.close()
            await w.wait_closed()
            handled.set()

        async def main():
            global handled
            handled = asyncio.Event()
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            r, w = await asyncio.open_connection("127.0.0.1", port)
            for m in (b"one\n", b"two\n", b"x" * 50000 + b"\n"):
                w.write(m)
                await w.drain()
                resp = await r.readline()
                print(len(resp), resp[:10])
            w.close()
            await w.wait_closed()
            await handled.wait()
            srv.close()
            await srv.wait_closed()
            print("closed")

        asyncio.run(main())
        """,
    ),
    py(
        "asyncio_unix_socket",
        r"""
        import asyncio, os

        async def handle(r, w):
            data = await r.read(100)
            w.write(data[::-1])
            await w.drain()
            w.close()

        async def main():
            srv = await asyncio.start_unix_server(handle, "sock")
            print(sorted(os.listdir(".")))
            r, w = await asyncio.open_unix_connection("sock")
            w.write(b"hello unix")
            await w.drain()
            print(await r.read(100))
            w.close()
            srv.close()
            await srv.wait_closed()

        asyncio.run(main())
        """,
    ),
]

# --------------------------------------------------------------------------- loopback servers

LOOPBACK = [
    py(
        "http_server_urllib",
        r"""
        import http.server, json, threading, urllib.error, urllib.request

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"path": self.path}).encode()
                self.send_response(404 if self.path == "/missing" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                data = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(201)
                self.end_headers()
                self.wfile.write(data[::-1])

            def log_message(self, fmt, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        with urllib.request.urlopen(base + "/a?b=1", timeout=20) as r:
            print(r.status, r.headers["Content-Type"], r.read())
        try:
            urllib.request.urlopen(base + "/missing", timeout=20)
        except urllib.error.HTTPError as e:
            print("HTTPError", e.code, e.read())
        req = urllib.request.Request(base + "/p", data=b"payload", method="POST")
        with urllib.request.urlopen(req, timeout=20) as r:
            print(r.status, r.read())
        srv.shutdown()
        print("done")
        """,
    ),
    py(
        "socketserver_tcp_localhost",
        r"""
        import socket, socketserver, threading

        class Echo(socketserver.StreamRequestHandler):
            def handle(self):
                for line in self.rfile:
                    self.wfile.write(b"echo:" + line)

        print(sorted({ai[4][0] for ai in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}))
        with socketserver.ThreadingTCPServer(("localhost", 0), Echo) as srv:
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            with socket.create_connection(("localhost", srv.server_address[1]), timeout=20) as c:
                f = c.makefile("rwb")
                for m in (b"a\n", b"bb\n"):
                    f.write(m)
                    f.flush()
                    print(f.readline())
                f.close()
            srv.shutdown()
        """,
    ),
    py(
        "udp_echo",
        r"""
        import socket, threading
        srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        srv.bind(("127.0.0.1", 0))

        def serve():
            for _ in range(3):
                data, addr = srv.recvfrom(2048)
                srv.sendto(data[::-1], addr)

        threading.Thread(target=serve, daemon=True).start()
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(20)
        for m in (b"ping", b"hello udp", b"x" * 1000):
            c.sendto(m, srv.getsockname())
            data, addr = c.recvfrom(2048)
            print(len(data), data[:12], addr == srv.getsockname())
        """,
    ),
    py(
        "ipv6_loopback",
        r"""
        import socket, threading
        print(socket.has_ipv6)
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.bind(("::1", 0))
        srv.listen()

        def serve():
            c, _ = srv.accept()
            c.sendall(c.recv(100).upper())
            c.close()

        threading.Thread(target=serve, daemon=True).start()
        c = socket.create_connection(("::1", srv.getsockname()[1]), timeout=20)
        c.sendall(b"over ipv6")
        print(c.recv(100), c.family)
        """,
    ),
    py(
        "unix_socketpair_fd_passing",
        r"""
        import os, socket
        a, b = socket.socketpair()
        r, w = os.pipe()
        socket.send_fds(a, [b"fd follows"], [w])
        msg, fds, _, _ = socket.recv_fds(b, 100, 1)
        os.write(fds[0], b"through passed fd")
        print(msg, len(fds), os.read(r, 100))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind("\0fidelity-abstract")
        t = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        t.sendto(b"abstract", "\0fidelity-abstract")
        print(s.recv(100))
        """,
    ),
]

# --------------------------------------------------------------------------- ssl

SSL = [
    py(
        "ssl_default_context",
        r"""
        import ssl
        ctx = ssl.create_default_context()
        print(ssl.OPENSSL_VERSION, ctx.verify_mode, ctx.check_hostname, ctx.minimum_version)
        print("ca certs:", len(ctx.get_ca_certs()))
        print(ssl.get_default_verify_paths())
        """,
    ),
    py(
        "ssl_loopback_selfsigned",
        r"""
        import socket, ssl, subprocess, threading
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.load_cert_chain("cert.pem", "key.pem")
        srv = socket.create_server(("127.0.0.1", 0))

        def serve():
            for _ in range(2):
                c, _ = srv.accept()
                try:
                    with sctx.wrap_socket(c, server_side=True) as s:
                        s.sendall(s.recv(100)[::-1])
                except ssl.SSLError:
                    c.close()

        threading.Thread(target=serve, daemon=True).start()
        cctx = ssl.create_default_context(cafile="cert.pem")
        with socket.create_connection(srv.getsockname(), timeout=20) as raw:
            with cctx.wrap_socket(raw, server_hostname="localhost") as s:
                print(s.version(), s.cipher()[0], s.getpeercert()["subject"])
                s.sendall(b"secret message")
                print(s.recv(100))
        try:
            with socket.create_connection(srv.getsockname(), timeout=20) as raw:
                ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")
        except ssl.SSLCertVerificationError as e:
            print("verify failed:", e.verify_message)
        """,
        needs=("openssl",),
    ),
]

# --------------------------------------------------------------------------- ptys

PTYS = [
    py(
        "pty_openpty",
        r"""
        import fcntl, os, struct, termios, tty
        m, s = os.openpty()
        print(os.isatty(s), os.isatty(m), os.ttyname(s).startswith("/dev/pts/"))
        attrs = termios.tcgetattr(s)
        print(bool(attrs[3] & termios.ECHO), bool(attrs[3] & termios.ICANON))
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(s, termios.TCSANOW, attrs)
        os.write(m, b"hello\n")
        print(os.read(s, 100))
        os.write(s, b"back\n")
        print(os.read(m, 100))
        tty.setraw(s)
        os.write(m, b"raw")
        print(os.read(s, 100))
        fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        print(struct.unpack("HHHH", fcntl.ioctl(s, termios.TIOCGWINSZ, b"\0" * 8)))
        """,
    ),
    py(
        "pty_fork",
        r"""
        import os, pty, sys
        pid, fd = pty.fork()
        if pid == 0:
            print("child isatty", sys.stdout.isatty(), os.isatty(0), os.getsid(0) == os.getpid())
            sys.stdout.flush()
            os._exit(3)
        out = b""
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, st = os.waitpid(pid, 0)
        print(out, os.waitstatus_to_exitcode(st))
        """,
    ),
]

# --------------------------------------------------------------------------- sqlite

SQLITE = [
    py(
        "sqlite_memory",
        r"""
        import sqlite3
        db = sqlite3.connect(":memory:")
        db.execute("create table t (id integer primary key, name text, score real)")
        db.executemany("insert into t(name, score) values (?, ?)", [("a", 1.5), ("b", 2.5), ("c", None), ("é", 3.0)])
        print(db.execute("select count(*), sum(score), avg(score), group_concat(name, ',') from t").fetchall())
        print(db.execute("select name, score from t order by score desc nulls last").fetchall())
        db.row_factory = sqlite3.Row
        print(dict(db.execute("select * from t where id = ?", (2,)).fetchone()))
        print(db.execute("select json_object('a', 1, 'b', json_array(1, 2))").fetchone()[0])
        db.create_function("rev", 1, lambda s: s[::-1])
        print(db.execute("select rev('hello')").fetchone()[0])
        with db:
            db.execute("with recursive c(x) as (values(1) union all select x+1 from c where x<5) "
                       "insert into t(name) select 'n'||x from c")
        print(db.execute("select count(*) from t").fetchone()[0])
        try:
            db.execute("select * from nope")
        except sqlite3.OperationalError as e:
            print("error:", e)
        """,
    ),
    py(
        "sqlite_disk_wal_threads",
        r"""
        import os, sqlite3, threading
        db = sqlite3.connect("test.db")
        print(db.execute("pragma journal_mode=wal").fetchone())
        db.execute("create table kv (k text primary key, v integer)")
        db.commit()

        def writer(i):
            c = sqlite3.connect("test.db", timeout=30)
            with c:
                c.executemany("insert into kv values (?, ?)", [(f"{i}-{j}", j) for j in range(50)])
            c.close()

        ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print(db.execute("select count(*), sum(v) from kv").fetchone())
        bk = sqlite3.connect("/tmp/fidelity-backup.db")
        db.backup(bk)
        print(bk.execute("select count(*) from kv").fetchone())
        bk.close()
        os.unlink("/tmp/fidelity-backup.db")
        print(sorted(os.listdir(".")))
        db.close()
        print(sorted(os.listdir(".")))
        """,
    ),
    py(
        "sqlite_fts5",
        r"""
        import sqlite3
        db = sqlite3.connect(":memory:")
        db.execute("create virtual table docs using fts5(title, body)")
        db.executemany("insert into docs values (?, ?)", [
            ("sandbox", "a box for untrusted programs"), ("fidelity", "programs behave the same in the box"),
            ("other", "nothing relevant here")])
        print(db.execute("select title from docs where docs match 'box' order by bm25(docs)").fetchall())
        print(db.execute("select highlight(docs, 1, '[', ']') from docs where docs match 'programs'").fetchall())
        """,
    ),
]

# --------------------------------------------------------------------------- numpy

NUMPY = [
    py(
        "numpy_linalg",
        r"""
        import numpy as np
        np.set_printoptions(precision=6, suppress=True)
        rng = np.random.default_rng(42)
        a = rng.standard_normal((6, 6))
        b = rng.standard_normal(6)
        x = np.linalg.solve(a, b)
        print(np.round(x, 6), np.allclose(a @ x, b))
        print(round(float(np.linalg.det(a)), 6), np.linalg.matrix_rank(a))
        print(np.round(np.linalg.eigvalsh(a + a.T), 6))
        print(np.round(np.linalg.svd(a, compute_uv=False), 6))
        q, r = np.linalg.qr(a)
        print(np.allclose(q @ r, a), np.round(np.linalg.inv(a)[0], 6))
        big = rng.standard_normal((300, 300))
        print(round(float(np.trace(big @ big.T)), 3))
        """,
    ),
    py(
        "numpy_arrays_io",
        r"""
        import os
        import numpy as np
        rng = np.random.default_rng(7)
        print(np.__version__ >= "1.20", rng.integers(0, 100, 10), rng.permutation(8))
        a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
        print(a.sum(axis=(0, 2)), a.strides, a.T.shape, a[..., ::2].ravel())
        print(np.round(np.abs(np.fft.fft(np.sin(np.linspace(0, 8 * np.pi, 16)))), 4))
        s = np.array([(1, 2.5, b"ab"), (3, 4.5, b"cd")], dtype=[("i", "<i4"), ("f", "<f8"), ("s", "S2")])
        print(s, s.dtype, np.sort(rng.standard_normal(5).round(3)))
        np.save("arr.npy", a)
        np.savez_compressed("/tmp/fidelity.npz", a=a, s=s)
        print(np.array_equal(np.load("arr.npy"), a), np.load("/tmp/fidelity.npz")["s"])
        os.remove("/tmp/fidelity.npz")
        m = np.memmap("mm.bin", dtype="float32", mode="w+", shape=(4,))
        m[:] = [1, 2, 3, 4]
        m.flush()
        print(open("mm.bin", "rb").read().hex())
        with np.errstate(divide="ignore", invalid="ignore"):
            print(np.array([1.0, 0.0, -1.0]) / 0.0)
        """,
    ),
]

# --------------------------------------------------------------------------- signals

SIGNALS = [
    py(
        "signal_alarm",
        r"""
        import signal, time

        def h(sig, frame):
            print("got", signal.Signals(sig).name)
            raise TimeoutError("alarm")

        signal.signal(signal.SIGALRM, h)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        try:
            while True:
                time.sleep(0.01)
        except TimeoutError as e:
            print("caught", e)
        signal.alarm(5)
        print("remaining", signal.alarm(0))
        """,
    ),
    py(
        "signal_handlers_sigterm_death",
        r"""
        import os, signal, sys
        got = []
        signal.signal(signal.SIGTERM, lambda s, f: got.append(signal.Signals(s).name))
        signal.signal(signal.SIGUSR1, lambda s, f: got.append(signal.Signals(s).name))
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
        print(got)
        print(signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGPIPE), signal.getsignal(signal.SIGCHLD))
        print(sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        """,
    ),
    py(
        "signal_sigint_keyboardinterrupt",
        r"""
        import os, signal, time
        print("start", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        """,
    ),
    py(
        "signal_sigkill_self_and_sigpipe",
        r"""
        import os, signal, subprocess
        p = subprocess.run("yes | head -n 3", shell=True, capture_output=True)
        print(p.stdout, p.returncode)
        r, w = os.pipe()
        os.close(r)
        try:
            os.write(w, b"x")
        except BrokenPipeError as e:
            print("EPIPE", e.errno)
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    ),
]

# --------------------------------------------------------------------------- subprocess

SUBPROCESS = [
    py(
        "subprocess_pipes_shell",
        r"""
        import subprocess
        p = subprocess.run(["sort", "-r"], input=b"b\na\nc\n", capture_output=True)
        print(p.stdout, p.returncode)
        p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out, _ = p.communicate(b"x" * 200000)
        print(len(out), p.returncode)
        print(subprocess.run("echo $((6*7)) | tr 4 X; echo err >&2; exit 3", shell=True, capture_output=True, text=True))
        try:
            subprocess.run(["false"], check=True)
        except subprocess.CalledProcessError as e:
            print(e)
        try:
            subprocess.run(["/nonexistent/prog"])
        except FileNotFoundError as e:
            print(e)
        try:
            subprocess.run(["sleep", "5"], timeout=0.2)
        except subprocess.TimeoutExpired as e:
            print(type(e).__name__, e.cmd)
        print(subprocess.check_output("ls / | grep -c usr", shell=True))
        """,
    ),
    py(
        "subprocess_sys_executable",
        r"""
        import json, subprocess, sys
        code = "import sys, os; print(sys.argv[1:], sys.executable == sys.argv[1], sys.flags.isolated, os.getcwd())"
        r = subprocess.run([sys.executable, "-c", code, sys.executable], capture_output=True, text=True)
        print(r.stdout, r.returncode)
        r = subprocess.run([sys.executable, "-m", "json.tool", "--sort-keys"], input='{"b": 1, "a": [1, 2]}',
                           capture_output=True, text=True)
        print(r.stdout)
        r = subprocess.run([sys.executable, "-c", "import numpy; print(numpy.ones(3).sum())"],
                           capture_output=True, text=True)
        print(r.stdout, r.stderr[-200:], r.returncode)
        r = subprocess.run([sys.executable, "-c", "raise SystemExit('child says no')"], capture_output=True, text=True)
        print(r.stderr, r.returncode, json.dumps(sys.argv))
        """,
    ),
]

# --------------------------------------------------------------------------- C and C++

C_HELLO = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) printf("argv[%d]=%s\n", i, argv[i]);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, stdin)) n += (int)strlen(line);
    printf("stdin bytes=%d\n", n);
    int xs[] = {5, 3, 9, 1, 7};
    qsort(xs, 5, sizeof xs[0], cmp);
    for (int i = 0; i < 5; i++) printf("%d ", xs[i]);
    printf("\nsizeof long=%zu ptr=%zu double=%.17g\n", sizeof(long), sizeof(void *), strtod("0.1", NULL));
    FILE *f = fopen("out.txt", "w");
    fprintf(f, "written by C\n");
    fclose(f);
    f = fopen("out.txt", "r");
    fgets(line, sizeof line, f);
    fclose(f);
    printf("read back: %s", line);
    printf("HOME=%s\n", getenv("HOME"));
    fprintf(stderr, "to stderr\n");
    return 4;
}
"""

C_THREADS = r"""
#include <pthread.h>
#include <stdio.h>

static long total;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t bar;

static void *work(void *arg) {
    long id = (long)arg, sum = 0;
    pthread_barrier_wait(&bar);
    for (long i = 0; i < 1000000; i++) sum += (i % 7) * id;
    pthread_mutex_lock(&mu);
    total += sum;
    pthread_mutex_unlock(&mu);
    return (void *)(id * 2);
}

int main(void) {
    pthread_t t[8];
    pthread_barrier_init(&bar, NULL, 8);
    for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, work, (void *)i);
    long rets = 0;
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(t[i], &r);
        rets += (long)r;
    }
    printf("total=%ld rets=%ld\n", total, rets);
    return 0;
}
"""

CPP_STL = r"""
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

int main() {
    std::vector<int> v(10);
    std::iota(v.begin(), v.end(), 1);
    std::reverse(v.begin(), v.end());
    std::map<std::string, int> m{{"b", 2}, {"a", 1}};
    for (auto &[k, x] : m) std::cout << k << "=" << x << " ";
    std::cout << std::accumulate(v.begin(), v.end(), 0) << "\n";
    try {
        throw std::runtime_error("caught one");
    } catch (const std::exception &e) {
        std::cout << "caught: " << e.what() << "\n";
    }
    std::vector<std::thread> ts;
    std::vector<long> out(4);
    for (int i = 0; i < 4; i++) ts.emplace_back([i, &out] { out[i] = (long)i * i; });
    for (auto &t : ts) t.join();
    for (long x : out) std::cout << x << ",";
    std::cout << "\n";
    std::ofstream("made.txt") << "x";
    std::vector<std::string> names;
    for (auto &e : std::filesystem::directory_iterator(".")) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    for (auto &n : names) std::cout << n << " ";
    std::cout << "\ncwd=" << std::filesystem::current_path() << std::endl;
    throw std::runtime_error("uncaught at the end");
}
"""

C_ASAN_CLEAN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    char *p = malloc(64);
    strcpy(p, "asan is happy");
    puts(p);
    free(p);
    return 0;
}
"""

C_ASAN_OVERFLOW = r"""
#include <stdlib.h>
int main(int argc, char **argv) {
    int *a = malloc(8 * sizeof(int));
    a[0] = argc;
    int r = a[8 + argc - 1];
    free(a);
    return r;
}
"""

C_LSAN_LEAK = r"""
#include <stdio.h>
#include <stdlib.h>
void *keep;
int main(void) {
    void *p = malloc(77);
    keep = malloc(5);
    p = 0;
    puts("leaving with a leak");
    return 0;
}
"""

CPP_ASAN_THREADS = r"""
#include <iostream>
#include <memory>
#include <thread>
#include <vector>
int main() {
    std::vector<std::thread> ts;
    std::vector<std::unique_ptr<int>> vals(4);
    for (int i = 0; i < 4; i++) ts.emplace_back([i, &vals] { vals[i] = std::make_unique<int>(i * 10); });
    for (auto &t : ts) t.join();
    for (auto &v : vals) std::cout << *v << " ";
    std::cout << "\n";
}
"""

C_SEGV = r"""
#include <stdio.h>
int main(void) {
    puts("about to crash");
    fflush(stdout);
    volatile int *p = 0;
    return *p;
}
"""

ASAN_NORM = ((r"[\w./-]*libasan\.so[\w.]*", "libasan.so"),)

C_CPP = [
    sh(
        "c_hello",
        "gcc -O2 -Wall -o prog prog.c && ./prog one 'two words' < input.txt; echo \"exit=$?\"",
        files={"prog.c": C_HELLO, "input.txt": "line one\nline two\n"},
        needs=("gcc",),
    ),
    sh(
        "c_pthreads",
        "gcc -O1 -pthread -o prog prog.c && ./prog",
        files={"prog.c": C_THREADS},
        needs=("gcc",),
    ),
    sh(
        "cpp_stl_uncaught",
        "g++ -std=c++17 -O1 -o prog prog.cc && ./prog",
        files={"prog.cc": CPP_STL},
        needs=("g++",),
    ),
    sh(
        "c_asan_clean",
        "gcc -g -fsanitize=address -o prog prog.c && ./prog",
        files={"prog.c": C_ASAN_CLEAN},
        needs=("gcc",),
        norm=ASAN_NORM,
    ),
    sh(
        "c_asan_heap_overflow",
        "gcc -g -O0 -fsanitize=address -o prog prog.c && ./prog",
        files={"prog.c": C_ASAN_OVERFLOW},
        needs=("gcc",),
        norm=ASAN_NORM,
    ),
    sh(
        "c_lsan_leak",
        "gcc -g -O0 -fsanitize=address -o prog prog.c && ./prog",
        files={"prog.c": C_LSAN_LEAK},
        needs=("gcc",),
        norm=ASAN_NORM,
    ),
    sh(
        "cpp_asan_threads",
        "g++ -g -std=c++17 -pthread -fsanitize=address -o prog prog.cc && ./prog",
        files={"prog.cc": CPP_ASAN_THREADS},
        needs=("g++",),
        norm=ASAN_NORM,
    ),
    sh(
        "c_segfault",
        'gcc -O0 -o prog prog.c && ./prog; echo "status=$?"',
        files={"prog.c": C_SEGV},
        needs=("gcc",),
    ),
]

# --------------------------------------------------------------------------- node

NODE_FS = r"""
const fs = require('fs'), path = require('path'), crypto = require('crypto');
fs.mkdirSync('d/e', {recursive: true});
fs.writeFileSync('d/a.txt', 'hello from node\n');
fs.writeFileSync(path.join('d', 'e', 'b.json'), JSON.stringify({x: [1, 2]}));
console.log(fs.readdirSync('d').sort(), fs.statSync('d/a.txt').size, fs.existsSync('nope'));
console.log(JSON.parse(fs.readFileSync('d/e/b.json', 'utf8')), process.cwd(), path.resolve('d'));
console.log(crypto.createHash('sha256').update('abc').digest('hex'), Buffer.from('héllo').toString('base64'));
fs.promises.readFile('d/a.txt', 'utf8').then(t => {
  console.log('async read:', t.trim());
  console.error('node stderr line');
  process.exitCode = 6;
});
"""

NODE_CHILD = r"""
const cp = require('child_process');
console.log(cp.execSync('echo hi | tr a-z A-Z').toString().trim());
const r = cp.spawnSync('sh', ['-c', 'echo out; echo err >&2; exit 3'], {encoding: 'utf8'});
delete r.pid;
console.log(r);
const c = cp.spawn(process.execPath, ['-e', 'console.log(process.argv.length, 6*7)']);
let out = '';
c.stdout.on('data', d => out += d);
// One after the other: two children at once finish in either order (a race of the program's
// own, which a full-suite run on a loaded host showed).
c.on('close', code => {
  console.log('child:', out.trim(), code);
  cp.exec('ls /nonexistent-dir', (err, so, se) => console.log('exec err code', err.code, se.includes('No such')));
});
"""

NODE_HTTP = r"""
const http = require('http');
const srv = http.createServer((req, res) => {
  let body = '';
  req.on('data', d => body += d);
  req.on('end', () => { res.writeHead(200, {'content-type': 'text/plain'}); res.end(req.method + ' ' + req.url + ' ' + body); });
});
srv.listen(0, '127.0.0.1', () => {
  const port = srv.address().port;
  const req = http.request({host: '127.0.0.1', port, path: '/x?y=1', method: 'POST'}, res => {
    let data = '';
    res.on('data', d => data += d);
    res.on('end', () => { console.log(res.statusCode, res.headers['content-type'], data); srv.close(() => console.log('closed')); });
  });
  req.end('payload');
});
"""

NODE_OS = r"""
const os = require('os');
console.log(os.cpus().length > 0, os.platform(), os.arch(), JSON.stringify(os.EOL), os.homedir(), os.tmpdir());
const ifs = os.networkInterfaces();
console.log('lo' in ifs, (ifs.lo || []).map(a => a.address).sort());
console.log(new Intl.NumberFormat('de-DE').format(1234567.891), new Date(0).toISOString());
console.log(new Date(Date.UTC(2024, 1, 29, 13, 45)).toLocaleString('en-US', {timeZone: 'America/New_York'}));
console.log(Intl.DateTimeFormat().resolvedOptions().timeZone, process.env.LANG, process.versions.node.split('.')[0] >= 18);
"""

NODE_THROW = r"""
function inner() { throw new TypeError('node went wrong'); }
function outer() { inner(); }
console.log('before');
outer();
"""

NODE = [
    sh("node_fs", "node main.js", files={"main.js": NODE_FS}, needs=("node",)),
    sh("node_child_process", "node main.js", files={"main.js": NODE_CHILD}, needs=("node",)),
    sh("node_http_loopback", "node main.js", files={"main.js": NODE_HTTP}, needs=("node",)),
    sh("node_os_intl", "node main.js", files={"main.js": NODE_OS}, needs=("node",)),
    sh(
        "node_uncaught",
        "node main.js",
        files={"main.js": NODE_THROW},
        needs=("node",),
        norm=((r"Node\.js v[\d.]+", "Node.js vX"),),
    ),
]

# --------------------------------------------------------------------------- Java

JAVA_MAIN = r"""
import java.util.*;
import java.util.stream.*;

public class Main {
    record Point(int x, int y) {}

    public static void main(String[] args) {
        List<String> words = List.of("delta", "alpha", "charlie", "bravo", "alpha");
        System.out.println(words.stream().distinct().sorted().collect(Collectors.joining(",")));
        Map<Integer, List<String>> byLen = words.stream().collect(Collectors.groupingBy(String::length, TreeMap::new, Collectors.toList()));
        System.out.println(byLen);
        System.out.println(IntStream.rangeClosed(1, 10).map(i -> i * i).sum());
        System.out.println(new Point(1, 2) + " " + Optional.ofNullable(null).orElse("empty"));
        System.out.println(String.format("%08.3f|%-5s|%x", Math.PI, "ab", 255));
        Deque<Integer> dq = new ArrayDeque<>();
        for (int i = 0; i < 5; i++) dq.push(i);
        System.out.println(dq + " " + new TreeSet<>(words).first());
        System.err.println("java stderr line");
        System.exit(words.size());
    }
}
"""

JAVA_THREADS = r"""
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import java.util.*;

public class Main {
    public static void main(String[] args) throws Exception {
        ExecutorService ex = Executors.newFixedThreadPool(4);
        AtomicLong total = new AtomicLong();
        ConcurrentHashMap<Integer, Integer> m = new ConcurrentHashMap<>();
        List<Future<Integer>> fs = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            final int n = i;
            fs.add(ex.submit(() -> { total.addAndGet(n); m.put(n, n * n); return n * 2; }));
        }
        int s = 0;
        for (Future<Integer> f : fs) s += f.get();
        ex.shutdown();
        ex.awaitTermination(10, TimeUnit.SECONDS);
        System.out.println(total.get() + " " + s + " " + new TreeMap<>(m));
        CompletableFuture<String> cf = CompletableFuture.supplyAsync(() -> "async").thenApply(String::toUpperCase);
        System.out.println(cf.get() + " " + (Runtime.getRuntime().availableProcessors() > 0));
        System.out.println("maxMemory>=128MiB " + (Runtime.getRuntime().maxMemory() >= (128L << 20)));
        Thread t = new Thread(() -> { throw new IllegalStateException("from thread"); }, "worker-1");
        t.start();
        t.join();
    }
}
"""

JAVA_FILES = r"""
import java.nio.file.*;
import java.nio.charset.Charset;
import java.util.*;
import java.util.stream.*;

public class Main {
    public static void main(String[] args) throws Exception {
        Files.createDirectories(Path.of("out/sub"));
        Files.writeString(Path.of("out/a.txt"), "héllo\n");
        Files.write(Path.of("out/sub/b.txt"), List.of("x", "y"));
        try (Stream<Path> s = Files.walk(Path.of("out"))) {
            System.out.println(s.map(Path::toString).sorted().collect(Collectors.toList()));
        }
        System.out.println(Files.readString(Path.of("out/a.txt")).trim() + " " + Files.size(Path.of("out/a.txt")));
        // Not user.home: Java takes it from the passwd entry of the uid (root's /root on the
        // host, the box user's /work), not from $HOME.
        for (String k : new String[] {"user.dir", "java.io.tmpdir", "file.encoding", "os.name", "line.separator"})
            System.out.println(k + "=" + System.getProperty(k).replace("\n", "\\n"));
        System.out.println(Charset.defaultCharset() + " " + Locale.getDefault() + " " + TimeZone.getDefault().getID());
        Path tmp = Files.createTempFile("fid", ".tmp");
        System.out.println(tmp.getParent() + " " + Files.deleteIfExists(tmp));
        throw new IllegalArgumentException("bad argument");
    }
}
"""

JAVA = [
    sh("java_version", "java -version; javac -version", needs=("java", "javac")),
    sh(
        "java_collections_streams",
        "javac Main.java && java Main",
        files={"Main.java": JAVA_MAIN},
        needs=("java", "javac"),
    ),
    sh(
        "java_threads",
        "javac Main.java && java Main",
        files={"Main.java": JAVA_THREADS},
        needs=("java", "javac"),
    ),
    sh(
        "java_source_launcher_files",
        "java Main.java",
        files={"Main.java": JAVA_FILES},
        needs=("java",),
    ),
]

# --------------------------------------------------------------------------- shell and coreutils

SHELL = [
    sh(
        "sh_text_tools",
        r"""
        printf 'b 2\na 1\nc 3\na 1\nd 10\n' > in.txt
        sort in.txt | uniq -c
        wc -l < in.txt; wc -c in.txt
        sed -n 's/a/A/p' in.txt
        awk '{s += $2} END {print s, NR, s / NR}' in.txt
        tr 'a-c' 'A-C' < in.txt | cut -d' ' -f1 | paste -sd,
        sort -k2,2n -u in.txt
        sort -k2,2nr in.txt | head -n 2 | tail -n 1
        grep -c a in.txt; grep -n '^[cd]' in.txt; grep -q zzz in.txt; echo "grep=$?"
        printf 'x\ny\n' | rev; printf 'a b c\n' | fold -w 2; nl -ba in.txt | head -2
        """,
    ),
    sh(
        "sh_seq_xargs_misc",
        r"""
        seq 1 3 20 | xargs -n 2 echo
        seq -w 8 11 | paste -sd' '
        seq 5 | xargs -P 2 -n 1 sh -c 'echo item $0' | sort
        yes | head -n 3
        factor 360 9973; expr 6 \* 7; numfmt --to=iec 123456789
        printf 'hello' | od -An -tx1; printf 'hello' | base64; printf 'hello' | sha256sum
        head -c 20 /dev/zero | wc -c
        timeout 0.2 sleep 5; echo "timeout=$?"
        basename /a/b/c.txt .txt; dirname /a/b/c.txt; realpath .; pwd
        t=$(mktemp -d) && dirname "$t" && rmdir "$t"
        """,
    ),
    sh(
        "sh_find_tar_gzip",
        r"""
        mkdir -p a/b/c && echo one > a/x.txt && echo two > a/b/y.txt && echo three > a/b/c/z.dat
        find . -type f -name '*.txt' | sort
        find a -type d | sort; find a -name '*.dat' -exec cat {} \;
        tar --sort=name --mtime=2020-01-01 --owner=0 --group=0 --numeric-owner -czf out.tgz a
        tar -tzf out.tgz
        tar -tzvf out.tgz | awk '{print $1, $2, $3, $6}'
        mkdir ex && tar -xzf out.tgz -C ex && diff -r a ex/a && echo same
        gzip -n -c a/x.txt | wc -c; gzip -c a/x.txt | gunzip; md5sum a/x.txt a/b/y.txt
        """,
    ),
    sh(
        "sh_date_fixed",
        r"""
        date -u -d '2024-02-29 13:45:00' '+%A %F %T %j %s'
        date -u -d @0
        TZ=America/New_York date -d '2024-03-10 07:30 UTC' '+%F %T %Z %z'
        date -u -d '2024-01-31 +1 month' +%F
        TZ=Europe/Paris date -d @1700000000 -R
        TZ=Asia/Tokyo date -d '2000-01-01T00:00:00Z' '+%c'
        date -d '2024-06-01' +%Z
        """,
    ),
    sh(
        "sh_printf_echo",
        r"""
        printf '%5.2f|%-6s|%x|%o|%c|%b\n' 3.14159 ab 255 8 xyz 'a\tb'
        /usr/bin/printf '%q %s\n' 'a b' "$(printf '\342\202\254')"
        echo -n x; echo; echo 'single $HOME' "double $((1+2))"
        printf '%s\n' "$(seq 3)" | wc -l
        """,
    ),
    sh(
        "sh_ls_la",
        r"""
        umask 022
        mkdir d && echo hello > d/f1 && : > d/empty && ln -s f1 d/link && mkdir d/sub
        chmod 640 d/f1; chmod 700 d/sub
        touch -h -d '2020-01-02 03:04:05' d/f1 d/empty d/link d/sub d
        ls -la --time-style=+%F_%T d | grep -v ' \.\.$'
        ls -l --time-style=long-iso d/f1
        stat -c '%n %s %a %F %h' d/* | sort
        ls -1 | sort
        """,
        norm=(OWNER,),
    ),
    sh(
        "sh_dev_stdio",
        r"""
        cat /dev/stdin | wc -l
        echo to-stderr > /dev/stderr
        echo to-stdout > /dev/stdout
        echo via-fd2 >&2
        echo data | tee t1.txt t2.txt > /dev/null; cat t1.txt t2.txt
        echo more | tee -a t1.txt; cat t1.txt
        echo null > /dev/null; head -c 4 /dev/urandom | wc -c
        """,
        stdin=b"line1\nline2\nline3\n",
    ),
    sh(
        "sh_script_features",
        r"""
        f() { echo "f got $# args: $*"; return 3; }
        f a 'b c'; echo "ret=$?"
        for i in 1 2 3; do case $i in 1) echo one;; 2) echo two;; *) echo other;; esac; done
        x=0; while [ $x -lt 3 ]; do x=$((x + 1)); done; echo "x=$x"
        cat <<EOF | sort -r
        beta
        alpha
        gamma
        EOF
        printf 'k1 v1\nk2 v2\n' | while read -r k v; do echo "$v=$k"; done
        (exit 7); echo "sub=$?"
        sh -c 'kill -TERM $$'; echo "killed=$?"
        trap 'echo trapped exit' EXIT
        set -e
        false || echo "handled"
        exit 5
        """,
    ),
    sh(
        "sh_env_locale",
        r"""
        env | sort
        echo "home=$HOME user=$USER tmp=$TMPDIR"
        cd ~ && pwd
        locale
        umask
        getconf PAGESIZE
        uname -s -m
        """,
    ),
]

# --------------------------------------------------------------------------- make

MAKEFILE = """\
CC = gcc
CFLAGS = -O2 -Wall
OBJS = main.o util.o

prog: $(OBJS)
\t$(CC) $(CFLAGS) -o $@ $(OBJS)

%.o: %.c util.h
\t$(CC) $(CFLAGS) -c $<

run: prog
\t./prog 21

clean:
\trm -f prog $(OBJS)

fail:
\t@echo about to fail
\tfalse

.PHONY: run clean fail
"""

MAKE_FILES = {
    "Makefile": MAKEFILE,
    "util.h": "int twice(int);\n",
    "util.c": '#include "util.h"\nint twice(int x) { return 2 * x; }\n',
    "main.c": (
        '#include <stdio.h>\n#include <stdlib.h>\n#include "util.h"\n'
        'int main(int c, char **v) { printf("twice=%d\\n", twice(atoi(v[1]))); return 0; }\n'
    ),
}

MAKE = [
    sh(
        "make_build_run",
        "make && make run && make && make clean && ls -1",
        files=MAKE_FILES,
        needs=("make", "gcc"),
    ),
    sh(
        "make_parallel_and_failure",
        'make -s -j2 prog && ./prog 5; make fail; echo "make=$?"',
        files=MAKE_FILES,
        needs=("make", "gcc"),
    ),
]

# --------------------------------------------------------------------------- /proc views

PROC = [
    py(
        "proc_self_status",
        r"""
        import os
        fields = {}
        for line in open("/proc/self/status"):
            k, _, v = line.partition(":")
            fields[k] = v.strip()
        for k in ("Name", "State", "Threads", "Umask"):
            print(k, fields[k])
        print("comm", open("/proc/self/comm").read().strip())
        print("cmdline", open("/proc/self/cmdline", "rb").read().split(b"\0"))
        print("cwd", os.readlink("/proc/self/cwd"), "exe", os.path.basename(os.readlink("/proc/self/exe")))
        print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
        """,
    ),
    sh(
        "proc_shell",
        r"""
        cat /proc/self/comm
        tr '\0' ' ' < /proc/self/cmdline; echo
        grep -E '^(Name|State|Threads):' /proc/self/status
        readlink /proc/self/cwd
        ls /proc/self/fd | sort -n | head -3
        test -r /proc/cpuinfo && echo cpuinfo readable
        """,
    ),
]

CORPUS: list[Entry] = [
    *STDLIB,
    *EXCEPTIONS,
    *THREADS,
    *MULTIPROCESSING,
    *ASYNCIO,
    *LOOPBACK,
    *SSL,
    *PTYS,
    *SQLITE,
    *NUMPY,
    *SIGNALS,
    *SUBPROCESS,
    *C_CPP,
    *NODE,
    *JAVA,
    *SHELL,
    *MAKE,
    *PROC,
]

PATHS = ("cold", "warm")

# Documented differences (each observed, with its reason; also in the README).
STDIN_MEMFD = (
    "stdin is a memfd (a regular file holding the whole input, as under 'prog < file'), not a "
    "pipe as under 'cat file | prog': the input is given whole before the run, and a file "
    "needs no writer thread and cannot block the program"
)

KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {
    ("stdio_kinds", "cold"): STDIN_MEMFD,
    ("stdio_kinds", "warm"): STDIN_MEMFD,
    ("exc_recursion", "warm"): (
        "warm path: the program's module frame runs one frame above the warm interpreter's "
        "bootstrap (inherent to forking a running interpreter; tracebacks hide it), so the "
        "recursion limit is reached one frame sooner: '[Previous line repeated 995' (host 996)"
    ),
}
"""(entry, path) -> why its output differs today; see tests/fidelity/DIFFERENCES.md. An entry
that raises on the warm path also shows WARM_FRAME; the table names its first cause."""

# --------------------------------------------------------------------------- machinery

WARM_DRIVER = """\
import os, signal, subprocess, sys
os.unlink("__main__.py")
rc = subprocess.call(["sh", "-c", {cmd!r}])
if rc < 0:
    signal.signal(-rc, signal.SIG_DFL)
    os.kill(os.getpid(), -rc)
sys.exit(rc)
"""
"""A command line on the warm path: the driver removes its own file from the work dir, so the
command sees the same files as on the host; stdio inherited, exit status (or signal) forwarded."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a run did, as compared: how it ended, stdout and stderr (decoded)."""

    end: str
    stdout: str
    stderr: str

    def text(self) -> str:
        return f"end: {self.end}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}\n"


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


_BOX_PY = re.compile(r"/\.agentrl/py/\d+")
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")
"""A pointer (6 or more hex digits): short hex such as float.hex() output is kept."""
_SAN_PID = re.compile(r"==\d+==")


def normalise(text: str, entry: Entry, workdir: str | None) -> str:
    """Rewrites what legitimately differs between the host run and the box run."""
    text = text.replace(sys.prefix, "<PY>")
    text = _BOX_PY.sub("<PY>", text)
    if workdir is not None:
        text = text.replace(workdir, "/work")
    text = _ADDR.sub("0xADDR", text)
    text = _SAN_PID.sub("==PID==", text)
    for pat, rep in entry.norm:
        text = re.sub(pat, rep, text)
    return text


def _host_env(workdir: str) -> dict[str, str]:
    dirs = [os.path.dirname(sys.executable), os.path.join(sys.base_prefix, "bin")]
    dirs = list(dict.fromkeys(dirs))
    return {
        "PATH": ":".join([*dirs, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": workdir,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "USER": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _write_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    for name, content in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)


def _host_root() -> str:
    shm = "/dev/shm"
    return shm if os.access(shm, os.W_OK) else tempfile.gettempdir()


_HOST_CACHE: dict[str, Outcome] = {}


def run_host(entry: Entry) -> Outcome:
    """Runs the entry on the host (once per session) and returns its normalised outcome."""
    if entry.name in _HOST_CACHE:
        return _HOST_CACHE[entry.name]
    work = tempfile.mkdtemp(prefix="fidelity-", dir=_host_root())
    try:
        os.chmod(work, 0o755)
        files = dict(entry.files)
        if entry.python is not None:
            files["__main__.py"] = entry.python
            argv = [sys.executable, "__main__.py"]
        else:
            assert entry.sh is not None
            argv = ["sh", "-c", entry.sh]
        _write_files(Path(work), files)
        env = {**_host_env(work), **entry.env}
        p = subprocess.run(
            argv,
            cwd=work,
            env=env,
            input=entry.stdin,
            capture_output=True,
            timeout=HOST_TIMEOUT_S,
            start_new_session=True,
        )
        end = f"signaled {-p.returncode}" if p.returncode < 0 else f"exited {p.returncode}"
        out = Outcome(
            end,
            normalise(_decode(p.stdout), entry, work),
            normalise(_decode(p.stderr), entry, work),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _HOST_CACHE[entry.name] = out
    return out


def run_box(entry: Entry, path: str, cold: Sandbox, warm: Sandbox) -> tuple[Outcome, ExecResult]:
    """Runs the entry through one path of the sandbox."""
    env = dict(entry.env)
    if entry.python is not None:
        sb = cold if path == "cold" else warm
        r = sb.run_python(entry.python, files=dict(entry.files), stdin=entry.stdin, env=env)
    elif path == "cold":
        assert entry.sh is not None
        r = cold.run(["sh", "-c", entry.sh], files=dict(entry.files), stdin=entry.stdin, env=env)
    else:
        r = warm.run_python(
            WARM_DRIVER.format(cmd=entry.sh), files=dict(entry.files), stdin=entry.stdin, env=env
        )
    if r.exit_code is not None:
        end = f"exited {r.exit_code}"
    elif r.signal is not None:
        end = f"signaled {r.signal}"
    else:
        end = f"{r.status} limit={r.limit} error={r.error}"
    if r.status.value not in ("ok", "runtime_error", "signaled"):
        end += f" ({r.status})"
    return (
        Outcome(
            end,
            normalise(_decode(r.stdout), entry, None),
            normalise(_decode(r.stderr), entry, None),
        ),
        r,
    )


def _diff(host: Outcome, box: Outcome, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            host.text().splitlines(keepends=True),
            box.text().splitlines(keepends=True),
            "host",
            f"box-{path}",
        )
    )


@pytest.fixture(scope="module")
def cold_sb() -> Iterator[Sandbox]:
    with Sandbox(LIMITS, warm=False, max_concurrency=2) as sb:
        yield sb


@pytest.fixture(scope="module")
def warm_sb() -> Iterator[Sandbox]:
    with Sandbox(LIMITS, max_concurrency=2) as sb:
        yield sb


def _params() -> list[object]:
    names = [e.name for e in CORPUS]
    assert len(names) == len(set(names)), "duplicate corpus entry names"
    assert {n for n, _ in KNOWN_DIFFERENCES} <= set(names), "KNOWN_DIFFERENCES names no entry"
    out = []
    for e in CORPUS:
        for path in PATHS:
            reason = KNOWN_DIFFERENCES.get((e.name, path))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(e, path, id=f"{e.name}-{path}", marks=marks))
    return out


def test_corpus_size() -> None:
    """The acceptance line asks for at least 60 ordinary programs."""
    assert len(CORPUS) >= 60


@pytest.mark.parametrize(("entry", "path"), _params())
def test_fidelity(entry: Entry, path: str, cold_sb: Sandbox, warm_sb: Sandbox) -> None:
    missing = [t for t in entry.needs if shutil.which(t) is None]
    if missing:
        pytest.skip(f"host lacks {', '.join(missing)}")
    host = run_host(entry)
    box, r = run_box(entry, path, cold_sb, warm_sb)
    if box != host:
        extra = f"\nbox status={r.status} denied_syscalls={r.denied_syscalls} error={r.error}"
        pytest.fail(
            f"{entry.name} on the {path} path differs from the host:\n{_diff(host, box, path)}{extra}"
        )
