"""The installation instructions work from a checkout, as written.

The package is on no package index, so every ``pip install`` line in ``docs/``, ``README.md``, ``CHANGELOG.md`` and
the package's own docstrings and error messages must be one that works from a checkout: the checkout itself
(``.``, with extras that ``pyproject.toml`` declares), ``torch`` from a named index, or a third-party dependency by
its declared requirement, never ``torchmetrics_diff`` by name. The versions ``docs/install.rst`` states must match
``pyproject.toml``'s declarations and the ``Makefile``'s torch pin. No network, no install: the files are read.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import torchmetrics_diff
from torchmetrics_diff import MeanMetric

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tested interpreter has tomllib
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
# every requirement the project declares, by canonical name (the same name in two extras has one specifier)
DECLARED = {
    canonicalize_name(req.name): req
    for req in map(Requirement, [*PROJECT["dependencies"], *(r for reqs in EXTRAS.values() for r in reqs)])
}
INSTALL = (ROOT / "docs" / "install.rst").read_text(encoding="utf-8")

# pip's options that the documented commands may use; those of the first set take a value
VALUED = {"-e", "--editable", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "--config-settings"}
FLAGS = {"-q", "--quiet", "-U", "--upgrade", "--no-deps"}
INDEXES = ("https://download.pytorch.org/whl/", "https://pypi.org/simple")


def _sources() -> list[Path]:
    """The files whose ``pip install`` lines a user reads: the docs, the README, the changelog, the package."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    files += sorted((ROOT / "docs").rglob("*.rst")) + sorted((ROOT / "docs").rglob("*.py"))
    files += sorted((ROOT / "torchmetrics_diff").rglob("*.py"))
    return [f for f in files if "_build" not in f.parts]


def _commands(text: str) -> list[str]:
    """What follows each ``pip install`` of ``text``, up to the end of its code span, comment or line."""
    # an rst inline literal may wrap onto the next line: read each on one line
    text = re.sub(r"``(.+?)``", lambda m: "``" + " ".join(m.group(1).split()) + "``", text, flags=re.DOTALL)
    found = []
    for line in text.splitlines():
        for match in re.finditer(r"pip install\b", line):
            rest = line[match.end() :].split("`")[0].split(" #")[0]
            found.append(rest.strip())
    return found


def _tokens(rest: str) -> list[str]:
    """Shell words of ``rest``; a closing quote of the string literal holding it is dropped."""
    while True:
        try:
            return shlex.split(rest)
        except ValueError:  # an unbalanced quote: the end of a Python string around the command
            if not rest:
                raise
            rest = rest[:-1]


def _problems(rest: str) -> list[str]:
    """Why ``pip install <rest>`` would not work from a checkout (empty when it would)."""
    words, problems, options, reqs = _tokens(rest), [], {}, []
    i = 0
    while i < len(words):
        word = words[i]
        if word in VALUED:
            if i + 1 == len(words):
                return [f"{word} without its value"]
            options[word] = words[i + 1]
            if word in ("-e", "--editable"):
                reqs.append(words[i + 1])
            i += 2
            continue
        if word.startswith("-") and word not in FLAGS:
            return [f"an option this test does not know: {word}"]
        if not word.startswith("-"):
            reqs.append(word)
        i += 1
    index = options.get("--index-url", options.get("-i"))
    if index is not None and not index.startswith(INDEXES):
        problems.append(f"an index that is neither PyPI nor PyTorch's: {index}")
    for req in reqs:
        local = re.fullmatch(r"(?P<path>[^\[\]]+)(?:\[(?P<extras>[^\]]*)\])?", req)
        if local and local["path"].startswith((".", "/")):
            if local["path"] != ".":
                problems.append(f"{req}: the commands run in the checkout, so the path is '.'")
            for extra in filter(None, (local["extras"] or "").split(",")):
                if extra not in EXTRAS:
                    problems.append(f"{req}: pyproject.toml declares no extra {extra!r}")
            continue
        try:
            parsed = Requirement(req)
        except InvalidRequirement:
            problems.append(f"{req!r} is neither a path nor a requirement")
            continue
        name = canonicalize_name(parsed.name)
        if name == "torchmetrics-diff":
            problems.append(f"{req}: no package index serves torchmetrics_diff; install the checkout ('.')")
        elif name == "torch":
            if index is None:
                problems.append(f"{req} without --index-url: the default build of whatever index pip reads")
        elif name not in DECLARED:
            problems.append(f"{req}: not a dependency pyproject.toml declares")
        elif parsed.specifier != DECLARED[name].specifier:
            problems.append(f"{req}: pyproject.toml declares {DECLARED[name]}")
    return problems


def test_every_pip_install_line_works_from_a_checkout():
    """Every ``pip install`` in the docs, README, changelog and package installs something that exists."""
    bad, seen = [], 0
    for path in _sources():
        for rest in _commands(path.read_text(encoding="utf-8")):
            seen += bool(rest)
            bad += [f"{path.relative_to(ROOT)}: pip install {rest}: {p}" for p in _problems(rest)]
    assert seen >= 10, f"only {seen} pip install commands found: the scan reads nothing"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("rest", "why"),
    [
        ("'torchmetrics_diff[plot]'", "no package index serves torchmetrics_diff"),
        ("torchmetrics-diff", "no package index serves torchmetrics_diff"),
        ('-e ".[plots]"', "declares no extra 'plots'"),
        ("torch", "without --index-url"),
        ("'matplotlib>=3.0'", "pyproject.toml declares matplotlib>=3.6"),
        ("seaborn", "not a dependency"),
        ("-e ../other", "the path is '.'"),
        ("torch --index-url https://example.com/simple", "neither PyPI nor PyTorch's"),
    ],
)
def test_the_check_refuses_commands_that_fail(rest, why):
    """The checker itself: commands that fail from a checkout are reported, with the reason."""
    assert any(why in p for p in _problems(rest)), _problems(rest)


def test_the_check_reads_the_documented_forms():
    """The working forms pass, a wrapped rst literal is read whole, a Python string's closing quote is dropped."""
    for rest in [
        '-e ".[lightning,plot]" --config-settings editable_mode=strict',
        ".",
        "torch --index-url https://download.pytorch.org/whl/cpu",
        "'accelerate>=1.0'\"",
    ]:
        assert _problems(rest) == [], rest
    assert _commands('a ``pip install -e ".[plot]"\n   --no-deps`` b') == ['-e ".[plot]" --no-deps']


def test_extras_named_in_prose_exist():
    """``".[x]"`` and "the ``x`` extra" name extras that pyproject.toml declares."""
    bad = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        named = re.findall(r"\"\.\[([\w,-]+)\]\"", text) + re.findall(r"\bthe `{0,2}([\w-]+)`{0,2} extra\b", text)
        bad += [f"{path.relative_to(ROOT)}: {x}" for group in named for x in group.split(",") if x not in EXTRAS]
    assert not bad, "extras pyproject.toml does not declare:\n" + "\n".join(bad)


def _version_rows() -> dict[str, tuple[str, str]]:
    """install.rst's version table: dependency -> (declared specifier, tested cell)."""
    rows = re.findall(r"\* - (\w+)[^\n]*\n\s+- ``([^`]+)``\n\s+- ([^\n]+)", INSTALL)
    return {name.lower(): (spec, tested) for name, spec, tested in rows}


def test_install_page_versions_match_pyproject():
    """Declared versions are pyproject.toml's; each tested version lies within its declaration."""
    rows = _version_rows()
    assert {"python", "torch"} <= rows.keys(), rows
    for name, (spec, tested) in rows.items():
        declared = PROJECT["requires-python"] if name == "python" else str(DECLARED[name].specifier)
        assert SpecifierSet(spec) == SpecifierSet(declared), f"{name}: install.rst says {spec}, pyproject {declared}"
        version = re.search(r"\d+\.\d+(?:\.\d+)?", tested)
        assert version, f"{name}: no tested version in {tested!r}"
        assert Version(version[0]) in SpecifierSet(declared), f"{name}: tested {version[0]} is not {declared}"


def test_makefile_pins_the_cpu_torch_the_docs_name():
    """``make test``'s torch is the CPU build that install.rst and the quickstart name, and the tested version."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    pins = re.findall(r"^TORCH \?= (\S+)$", makefile, flags=re.MULTILINE)
    cpu = [p for p in pins if p.endswith("+cpu")]
    assert len(cpu) == 1, pins
    pin = Requirement(cpu[0])
    (version,) = (Version(s.version) for s in pin.specifier)
    assert pin.name == "torch" and version.local == "cpu"
    assert version in DECLARED["torch"].specifier
    quickstart = (ROOT / "docs" / "quickstart.rst").read_text(encoding="utf-8")
    assert f"``{pin}``" in INSTALL and f"``{pin}``" in quickstart
    assert version.public in _version_rows()["torch"][1]
    index = re.search(r"^TORCH_INDEX \?= .*(https://\S+?)\)", makefile, flags=re.MULTILINE)
    assert index and f"``{index[1]}``" in INSTALL, "the Makefile's default index is the one install.rst names"


def test_missing_matplotlib_message_names_a_working_command(monkeypatch):
    """``plot()`` without matplotlib raises, naming an install command that works."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ModuleNotFoundError, match="pip install") as err:
        MeanMetric().plot(torch.tensor(1.0))
    (rest,) = _commands(str(err.value))
    assert _problems(rest) == [] and "matplotlib" in rest


def test_missing_accelerate_message_names_a_working_command(monkeypatch):
    """The Accelerate helpers without Accelerate raise, naming an install command that works."""
    from torchmetrics_diff.integrations.accelerate import real_rows

    for name in ("accelerate", "accelerate.data_loader", "accelerate.utils"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ModuleNotFoundError, match="pip install") as err:
        real_rows(object(), torch.zeros(3))
    (rest,) = _commands(str(err.value))
    assert _problems(rest) == [] and "accelerate" in rest


def test_license_and_changelog():
    """LICENSE is the Apache License 2.0 that pyproject.toml names; the changelog has this version and Unreleased."""
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert PROJECT["license"] == {"text": "Apache-2.0"}
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "Copyright 2026 The torchmetrics_diff authors" in license_text
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert PROJECT["version"] == torchmetrics_diff.__version__ in headings


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.one_child
@pytest.mark.parametrize("configured", [False, True])
def test_make_reads_pytorchs_cpu_index_unless_pip_is_configured(configured):
    """``make -n venv`` (a dry run: nothing installed): the CPU pin from PyTorch's CPU index on a machine with no
    pip configuration (the public index), and from pip's own sources where its configuration names some."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf is read
    if configured:
        env["PIP_FIND_LINKS"] = "/nonexistent/wheelhouse"
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "venv", f"PYTHON={sys.executable}", "VENV=/nonexistent/venv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (line,) = [ln for ln in out.splitlines() if re.search(r"pip install .*\"torch==", ln)]
    assert '"torch==2.13.0+cpu"' in line or sys.platform == "darwin"
    assert ("--index-url" in line) is not configured, line
    if not configured:
        assert line.endswith("--index-url https://download.pytorch.org/whl/cpu"), line
