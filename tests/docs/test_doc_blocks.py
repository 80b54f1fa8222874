"""The docs' Python code blocks run as written, or are marked as fragments with the reason.

Every ``.rst`` page under ``docs/`` and the README, one test per page: the page's unmarked blocks run in order in
one namespace in this process, its ``torchrun`` blocks as one script under ``torchrun --nproc-per-node=2`` (CPU,
gloo), its ``script`` blocks and included example files as programs of their own (every page's programs start
side by side when the first page's test starts); a failure names the page and the line. Fragments are not run,
but they must parse and their imports from the package must work. The markers are described in
:mod:`tests._helpers.doc_blocks` and in the docs' architecture page.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests._helpers import doc_blocks as D

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.rst")), ROOT / "README.md"]
TIMEOUT_S = 240


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _file_name(page: str, suffix: str) -> str:
    return re.sub(r"[^\w]+", "_", page) + suffix


def _programs(path: Path, folder: Path) -> list[tuple[str, list[str]]]:
    """A page's programs as (what the failure says, command): its torchrun blocks joined into one script, each
    ``script`` block, each included file (once)."""
    page = _page_id(path)
    blocks = D.collect(path, ROOT)
    programs = []
    torchrun = [block for block in blocks if block.mode == "torchrun" and block.include is None]
    if torchrun:
        script = folder / _file_name(page, ".py")
        script.write_text(D.joined_script(torchrun), encoding="utf-8")
        lines = ", ".join(str(block.line) for block in torchrun)
        programs.append((f"{page}:{lines}: the torchrun blocks do not run", D.torchrun_command(script)))
    seen: set[Path] = set()
    for block in blocks:
        if block.mode == "script" or (block.mode == "torchrun" and block.include is not None):
            if block.include is not None:
                if block.include in seen:
                    continue
                seen.add(block.include)
                script = block.include
            else:
                script = folder / _file_name(f"{page}_{block.line}", ".py")
                script.write_text(block.padded(), encoding="utf-8")
            cmd = D.torchrun_command(script) if block.mode == "torchrun" else [sys.executable, str(script)]
            programs.append((f"{block.where}: this {block.mode} block does not run", cmd))
    return programs


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[tuple[str, Future]]]]:
    """Every page's programs, all started at the first page's test: they spend their time importing and meeting
    more than computing, so side by side they take about as long as the slowest one. Each runs in a folder of its
    own (for what it writes) and is killed with its process group after ``TIMEOUT_S``."""
    folder = tmp_path_factory.mktemp("doc_programs")
    programs = [(_page_id(path), what, cmd) for path in PAGES for what, cmd in _programs(path, folder)]

    def run(index: int) -> tuple[int, str]:
        cwd = folder / f"run{index}"
        cwd.mkdir()
        return D.run_command(programs[index][2], cwd, TIMEOUT_S, ROOT)

    futures: dict[str, list[tuple[str, Future]]] = {}
    with ThreadPoolExecutor(max_workers=max(len(programs), 1)) as pool:
        for index, (page, what, _) in enumerate(programs):
            futures.setdefault(page, []).append((what, pool.submit(run, index)))
        yield futures


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_page_code_blocks_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launched: dict[str, list[tuple[str, Future]]]
) -> None:
    blocks = D.collect(path, ROOT)
    problems = [problem for block in blocks for problem in block.problems]
    assert not problems, "\n".join(problems)
    failures = D.check_fragments(blocks)

    monkeypatch.chdir(tmp_path)  # what the blocks write (figures, logs) goes to a fresh folder
    monkeypatch.setenv("MPLBACKEND", "Agg")
    try:
        failures += D.run_in_process(blocks)
    finally:
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")

    for what, future in launched.get(_page_id(path), []):
        rc, out = future.result()
        if rc != 0:
            failures.append(f"{what} (exit {rc}):\n{out[-3000:]}")
    assert not failures, "\n\n".join(failures)


def test_the_docs_have_blocks_of_every_kind() -> None:
    """The collector sees the docs' blocks (a parser that found nothing would pass every page)."""
    modes = [block.mode for path in PAGES for block in D.collect(path, ROOT)]
    for mode in D.MODES:
        assert mode in modes, mode


# --- the collector itself, on synthetic pages -------------------------------------------------------------------

PAGE = """\
Title
=====

Some text.

.. code-block:: python

   x = 1
   y = x + 1

.. code-block:: console

   $ make test

.. fragment: a line of a training loop (needs a model)

.. code-block:: python

   loss = model(batch)

.. code-block:: python

   z = y + 1
   undefined_name + z
"""


def test_collector_reads_languages_markers_and_lines() -> None:
    blocks = D.collect_rst(PAGE, "docs/page.rst")
    assert [(b.line, b.code_line, b.mode) for b in blocks] == [
        (6, 8, "run"),
        (11, 13, "skip"),
        (17, 19, "fragment"),
        (21, 23, "run"),
    ]
    assert blocks[2].reason == "a line of a training loop (needs a model)"
    assert blocks[0].code == "x = 1\ny = x + 1"


def test_a_broken_unmarked_block_fails_naming_its_page_and_line() -> None:
    failures = D.run_in_process(D.collect_rst(PAGE, "docs/page.rst"))
    assert len(failures) == 1, failures
    message = failures[0]
    assert message.startswith("docs/page.rst:21: this python block does not run"), message
    assert "NameError" in message and "undefined_name" in message, message
    assert 'File "docs/page.rst", line 24' in message, message  # the traceback names the page's own line


def test_a_fragment_without_a_reason_is_a_problem() -> None:
    page = PAGE.replace(".. fragment: a line of a training loop (needs a model)", ".. fragment:")
    problems = [p for block in D.collect_rst(page, "docs/page.rst") for p in block.problems]
    assert problems == ["docs/page.rst:17: a block marked as a fragment must say why (`fragment: <reason>`)"]


def test_a_literal_block_that_reads_as_python_must_state_its_language() -> None:
    page = "Run this::\n\n   import torch\n   print(torch.ones(2))\n\nAn error::\n\n   RuntimeError: ranks disagree\n"
    blocks = D.collect_rst(page, "docs/page.rst")
    assert [b.mode for b in blocks] == ["skip", "skip"]
    assert len(blocks[0].problems) == 1 and blocks[0].problems[0].startswith("docs/page.rst:1:"), blocks[0].problems
    assert blocks[1].problems == []
    (block,) = D.collect_rst(".. code-block::\n\n   x = 1\n", "docs/page.rst")  # no language: Sphinx's default
    assert block.problems == ["docs/page.rst:1: this block reads as Python: state its language"]


def test_pycon_blocks_are_doctests() -> None:
    page = ".. code-block:: pycon\n\n   >>> 1 + 1\n   3\n"
    failures = D.run_in_process(D.collect_rst(page, "docs/page.rst"))
    assert len(failures) == 1 and "Expected:" in failures[0] and "Got:" in failures[0], failures


def test_markdown_fences_and_markers() -> None:
    text = "# T\n\n<!-- fragment: needs a loader -->\n```python\nfor x in loader:\n    pass\n```\n\n"
    text += "```python\na = 2\n```\n"
    blocks = D.collect_markdown(text, "README.md")
    assert [(b.line, b.mode, b.reason) for b in blocks] == [(4, "fragment", "needs a loader"), (9, "run", "")]


def test_torchrun_blocks_join_with_the_pages_line_numbers() -> None:
    page = ".. torchrun:\n\n.. code-block:: python\n\n   a = 1\n\n.. torchrun:\n\n.. code-block:: python\n\n   b = a\n"
    blocks = D.collect_rst(page, "docs/page.rst")
    assert [b.mode for b in blocks] == ["torchrun", "torchrun"]
    script = D.joined_script(blocks).splitlines()
    assert script[4] == "a = 1" and script[10] == "b = a", script


def test_a_fragment_must_parse_and_import_what_exists() -> None:
    page = ".. fragment: a loop\n\n.. code-block:: python\n\n"
    page += "   from torchmetrics_diff import NoSuchMetric\n   m = NoSuchMetric()\n"
    failures = D.check_fragments(D.collect_rst(page, "docs/page.rst"))
    assert len(failures) == 1 and failures[0].startswith("docs/page.rst:3: this fragment's import fails (line 5)")
    assert "NoSuchMetric" in failures[0], failures
    broken = page.replace("m = NoSuchMetric()", "for x in loader")
    failures = D.check_fragments(D.collect_rst(broken, "docs/page.rst"))
    assert len(failures) == 1 and "not valid Python" in failures[0], failures


def test_a_program_that_fails_or_hangs_is_reported(tmp_path: Path) -> None:
    """A ``script`` block's file keeps the page's line numbers; a program past its timeout is killed."""
    page = ".. script: a whole program\n\n.. code-block:: python\n\n   import sys\n   raise SystemExit('boom')\n"
    (block,) = D.collect_rst(page, "docs/page.rst")
    assert block.mode == "script"
    script = tmp_path / "page.py"
    script.write_text(block.padded().replace("'boom'", "1 / 0"), encoding="utf-8")
    rc, out = D.run_command([sys.executable, str(script)], tmp_path, 60, ROOT)
    assert rc == 1 and "ZeroDivisionError" in out and "line 6" in out, out
    rc, out = D.run_command([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, 1, ROOT)
    assert rc == -9 and out.startswith("killed after 1s"), out


def test_a_torchrun_program_whose_process_group_outlives_it_fails(tmp_path: Path) -> None:
    """A DDP module left in a global keeps the default group, and gloo's threads, after
    ``destroy_process_group()`` and until the interpreter shuts down, where the process may abort after its work:
    ``run_to_exit`` fails such a program every time."""
    script = tmp_path / "kept.py"
    script.write_text(
        "import torch\n"
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "dist.init_process_group('gloo')\n"
        "model = DistributedDataParallel(torch.nn.Linear(2, 2))\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n",
        encoding="utf-8",
    )
    rc, out = D.run_command(D.torchrun_command(script), tmp_path, 120, ROOT)
    assert rc != 0 and "destroy_process_group() returned with gloo's worker threads still running" in out, out
    assert "the DDP module in model is still alive" in out, out
