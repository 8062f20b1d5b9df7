"""Installing lnbook where readers are: its lower bounds resolve together, it installs next to a
torch that is already there without touching it, and the notebooks' Colab set-up cell (tried in
a throwaway environment that already has torch, as Colab has) installs it, or, in a kernel
without lnbook outside Colab, says how to get it."""

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()
DEPENDENCIES = [Requirement(d) for d in re.findall(r'^\s*"([^"]+)",', PYPROJECT.split("dependencies = [")[1].split("]")[0], re.M)]
LOWEST_PYTHON = re.search(r'requires-python = ">=(\d+\.\d+)"', PYPROJECT).group(1)
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable", "ConnectTimeoutError")


def test_dependencies_have_no_upper_bounds_or_pins():
    """An upper bound or a pin could make pip replace the torch a reader (or Colab) already has."""
    assert {d.name for d in DEPENDENCIES} >= {"torch", "numpy", "triton"}
    assert [str(d) for d in DEPENDENCIES if any(s.operator != ">=" for s in d.specifier) or len(d.specifier) != 1] == []


def lowest(requirement: Requirement) -> str:
    """``torch>=2.6`` as ``torch==2.6``, its marker kept."""
    (spec,) = requirement.specifier
    return f"{requirement.name}=={spec.version}" + (f"; {requirement.marker}" if requirement.marker else "")


def resolve(requirements: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """pip's resolver on PyPI's metadata (no install, nothing but metadata downloaded), for
    Linux x86-64 wheels on the lowest Python that lnbook supports."""
    platforms = [a for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014", "manylinux1", "linux")
                 for a in ("--platform", f"{tag}_x86_64")]
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                          "--only-binary=:all:", "--python-version", LOWEST_PYTHON, *platforms,
                          "--target", str(tmp_path / "never-written"), "--report", str(tmp_path / "report.json"),
                          *requirements], capture_output=True, text=True, timeout=600)
    if pip.returncode and any(sign in pip.stderr for sign in OFFLINE):
        pytest.skip(f"PyPI cannot be reached, so the lower bounds cannot be resolved:\n{pip.stderr[-2000:]}")
    return pip


def test_the_lowest_declared_versions_install_together(tmp_path):
    """Every dependency at its lower bound at once, on Python 3.10: a set that a reader's pip
    can actually install (a lower bound that pins a conflicting partner would be a lie)."""
    requirements = [lowest(d) for d in DEPENDENCIES]
    pip = resolve(requirements, tmp_path)
    assert pip.returncode == 0, f"pip cannot install {requirements} together:\n{pip.stderr[-3000:]}"
    report = json.loads((tmp_path / "report.json").read_text())["install"]
    chosen = {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"]) for i in report}
    assert {d.name: chosen[canonicalize_name(d.name)] for d in DEPENDENCIES} == {
        d.name: Version(next(iter(d.specifier)).version) for d in DEPENDENCIES}


def test_the_resolution_check_catches_a_conflicting_bound(tmp_path):
    """torch 2.5 pins triton 3.1, so these two lower bounds cannot both hold."""
    pip = resolve(["torch==2.5.0", "triton==3.2.0"], tmp_path)
    assert pip.returncode != 0 and "ResolutionImpossible" in pip.stderr


def test_installing_lnbook_upgrades_nothing_already_installed(tmp_path):
    """pip's own resolver, offline, against this environment's torch: lnbook is all it would add."""
    report = tmp_path / "report.json"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                          "--quiet", "--report", str(report), str(ROOT)], capture_output=True, text=True)
    assert pip.returncode == 0, f"pip cannot install lnbook next to what is installed:\n{pip.stderr}"
    would_install = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert would_install == ["lnbook"]


SETUP_CELL = "".join(json.loads((ROOT / "notebooks" / "00_quickstart.ipynb").read_text())["cells"][1]["source"])
REPOSITORY = "git+https://github.com/lnbook/layernorm-book"
# Runs one notebook cell in IPython, as a kernel would (so that %pip works), optionally with a
# stand-in for the google.colab module; prints the exception the cell raised, if any.
RUN_CELL = """import sys, types
from IPython.core.interactiveshell import InteractiveShell
if sys.argv[1] == "colab":
    sys.modules["google.colab"] = types.ModuleType("google.colab")
error = InteractiveShell.instance().run_cell(sys.argv[2]).error_in_exec
print(f"RAISED {type(error).__name__}: {error}" if error else "RAISED nothing")
"""


@pytest.fixture(scope="module")
def colab(tmp_path_factory) -> Path:
    """The Python of a new environment that sees this environment's packages, lnbook's own
    files left out, as Colab's Python sees its preinstalled torch, NumPy and the rest."""
    home = tmp_path_factory.mktemp("colab")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "env")], check=True)
    preinstalled = home / "preinstalled"
    preinstalled.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not re.match(r"_*(editable__\S*)?lnbook", entry.name):
            (preinstalled / entry.name).symlink_to(entry)
    python = home / "env" / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "preinstalled.pth").write_text(f"{preinstalled}\n")
    return python


def run_setup_cell(python: Path, where: str) -> subprocess.CompletedProcess:
    cell = SETUP_CELL.replace(REPOSITORY, f"git+file://localhost{ROOT}")  # the checkout's last commit, not GitHub's
    return subprocess.run([python, "-c", RUN_CELL, where, cell], capture_output=True, text=True, timeout=600)


def installed_here(python: Path) -> list[str]:
    """The distributions installed in the environment itself, not the ones it borrows."""
    code = "import sysconfig, pathlib; print(*sorted(p.name for p in pathlib.Path(sysconfig.get_paths()['purelib']).glob('*.dist-info')))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def torch_seen_by(python: Path) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__version__, torch.__file__)"],
                          capture_output=True, text=True, check=True).stdout


def test_the_setup_cell_says_how_to_fix_a_kernel_without_lnbook_then_installs_it_in_colab(colab):
    torch_before = torch_seen_by(colab)
    outside = run_setup_cell(colab, "local")
    assert "RAISED ModuleNotFoundError: This kernel's Python" in outside.stdout, outside.stdout + outside.stderr
    assert "Kernel > Change Kernel" in outside.stdout and "make lab" in outside.stdout
    inside = run_setup_cell(colab, "colab")
    if "RAISED nothing" not in inside.stdout and any(sign in inside.stdout + inside.stderr for sign in OFFLINE):
        pytest.skip(f"the package index cannot be reached, so pip cannot build lnbook:\n{inside.stdout[-2000:]}")
    assert "RAISED nothing" in inside.stdout, inside.stdout + inside.stderr
    assert [name.split("-")[0] for name in installed_here(colab)] == ["lnbook"]  # nothing reinstalled beside it
    assert torch_seen_by(colab) == torch_before  # the same torch, from the same place
    imported = subprocess.run([colab, "-c", "import lnbook.norms, sys; print(lnbook.__file__.startswith(sys.prefix))"],
                              capture_output=True, text=True)
    assert imported.stdout.strip() == "True", imported.stderr
