"""Collect the Python code blocks of the docs (reStructuredText pages and the README) and run them.

How a page marks a block is an rst comment on the line before the block (blank lines may come between; Sphinx
renders nothing for a comment); in Markdown, an HTML comment before the fence:

* no marker: the block runs in one process, in the page's namespace (the page's unmarked blocks run in order,
  each one building on the ones before it);
* ``.. torchrun:`` the block runs under ``torchrun --standalone --nproc-per-node=2`` (CPU, gloo), joined with the
  page's other ``torchrun`` blocks, in order, into one script;
* ``.. script:`` the block is a whole program, run alone as ``python <file>`` (for launchers that start their own
  processes, such as Lightning's ``Trainer(devices=2)``);
* ``.. fragment: <reason>`` the block cannot run alone (a line of a training loop, a GPU, a data set, another
  library's code); the reason is required.

A ``literalinclude`` of a ``.py`` file runs the whole file (once per page, however many excerpts it shows) as a
script, or under ``torchrun`` when marked so. A ``::`` literal block whose text parses as Python must be written
as ``.. code-block:: python`` instead, so that its language, and therefore whether it runs, is stated.

Each block's code keeps the line numbers of its page (it is padded with empty lines before it is compiled), so a
traceback names the page and the line of the docs.
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import signal
import subprocess
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from pathlib import Path

PYTHON_LANGUAGES = frozenset({"python", "python3", "py", "pycon"})
MODES = ("run", "torchrun", "script", "fragment")
NPROC = 2

_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\.\s+(?P<name>code-block|code|sourcecode|literalinclude)::\s*(?P<arg>.*)$")
_RST_MARKER = re.compile(r"^\s*\.\.\s+(?P<mode>fragment|torchrun|script):(?P<rest>.*)$")
_MD_MARKER = re.compile(r"^\s*<!--\s*(?P<mode>fragment|torchrun|script):(?P<rest>.*?)-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")


@dataclass
class Block:
    """One code block of a page.

    Attributes:
        page: the page's path, relative to the repository root (``docs/quickstart.rst``).
        line: 1-based line of the directive (or the fence, or the ``::`` paragraph's end).
        code_line: 1-based line of the code's first line in the page (0 for an included file).
        language: the stated language (``""`` for a ``::`` literal block).
        code: the block's text, dedented.
        mode: one of :data:`MODES`, or ``"skip"`` for a block that is not Python.
        reason: the fragment's reason.
        include: the included file of a ``literalinclude``.
        problems: what is wrong with the block's marking (reported by the test without running anything).
    """

    page: str
    line: int
    code_line: int
    language: str
    code: str
    mode: str = "run"
    reason: str = ""
    include: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def padded(self) -> str:
        """The code with as many empty lines before it as put its first line at its line in the page."""
        return "\n" * max(self.code_line - 1, 0) + self.code + "\n"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _marker(lines: list[str], index: int, pattern: re.Pattern[str]) -> tuple[str, str] | None:
    """The (mode, rest) of a marker comment on the last non-blank line before ``lines[index]``."""
    j = index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    match = pattern.match(lines[j])
    return (match.group("mode"), match.group("rest").strip()) if match else None


def _apply_marker(block: Block, marker: tuple[str, str] | None) -> None:
    if marker is None:
        return
    mode, rest = marker
    block.mode = mode
    if mode == "fragment":
        block.reason = rest
        if not rest:
            block.problems.append(f"{block.where}: a block marked as a fragment must say why (`fragment: <reason>`)")


def _body(lines: list[str], start: int, indent: int) -> tuple[list[str], int]:
    """The lines after ``start`` indented deeper than ``indent`` (blank lines included), and the next index."""
    j = start
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
        j += 1
    body = lines[start:j]
    while body and not body[-1].strip():
        body.pop()
    return body, j


def _options(body: list[str]) -> tuple[dict[str, str], int]:
    """A directive's ``:name: value`` options and the index in ``body`` where its content starts."""
    options: dict[str, str] = {}
    k = 0
    while k < len(body) and body[k].strip().startswith(":"):
        match = re.match(r"^\s*:([\w-]+):\s*(.*)$", body[k])
        if match:
            options[match.group(1)] = match.group(2)
        k += 1
    while k < len(body) and not body[k].strip():
        k += 1
    return options, k


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def collect_rst(text: str, page: str, base: Path | None = None) -> list[Block]:
    """Every code block of an rst page, in order (literal ``::`` blocks only when their text parses as Python).

    Args:
        text: the page's text.
        page: the page's name in messages (its path relative to the repository root).
        base: the page's folder, against which a ``literalinclude`` path is resolved.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        literal = directive is None and line.rstrip().endswith("::") and not line.lstrip().startswith("..")
        if not (directive or literal):
            i += 1
            continue
        indent = _indent(line)
        body, end = _body(lines, i + 1, indent)
        if directive:
            options, k = _options(body)
            content = body[k:]
            name, arg = directive.group("name"), directive.group("arg").strip()
            if name == "literalinclude":
                path = (base / arg) if base is not None else Path(arg)
                language = options.get("language", "python" if arg.endswith(".py") else "")
                block = Block(page, i + 1, 0, language, "", include=path)
                if language in PYTHON_LANGUAGES:
                    block.mode = "script"
                else:
                    block.mode = "skip"
            else:
                language = arg.lower()
                code = textwrap.dedent("\n".join(content))
                block = Block(page, i + 1, i + 2 + k, language, code)
                if language not in PYTHON_LANGUAGES:
                    block.mode = "skip"
                    if not language and code.strip() and _parses(code):
                        block.problems.append(f"{block.where}: this block reads as Python: state its language")
        else:
            k = 0
            while k < len(body) and not body[k].strip():
                k += 1
            code = textwrap.dedent("\n".join(body[k:]))
            block = Block(page, i + 1, i + 2 + k, "", code, mode="skip")
            if code.strip() and _parses(code):
                block.problems.append(
                    f"{block.where}: this `::` literal block reads as Python: write it as a `.. code-block:: python` "
                    "(marked as the docs' test needs)"
                )
        if block.mode != "skip":
            _apply_marker(block, _marker(lines, i, _RST_MARKER))
            if block.include is not None and block.mode == "run":
                block.mode = "script"
        blocks.append(block)
        i = max(end, i + 1)
    return blocks


def collect_markdown(text: str, page: str) -> list[Block]:
    """Every fenced code block of a Markdown page, in order (markers are ``<!-- fragment: reason -->`` & co.)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        language = fence.group("lang").lower()
        block = Block(page, i + 1, i + 2, language, textwrap.dedent("\n".join(lines[i + 1 : j])))
        if language in PYTHON_LANGUAGES:
            _apply_marker(block, _marker(lines, i, _MD_MARKER))
        else:
            block.mode = "skip"
        blocks.append(block)
        i = j + 1
    return blocks


def collect(path: Path, root: Path) -> list[Block]:
    """The blocks of one page (``.rst`` or ``.md``), named by their path relative to ``root``."""
    page = path.relative_to(root).as_posix()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return collect_markdown(text, page)
    return collect_rst(text, page, base=path.parent)


def _doctest(block: Block, namespace: dict[str, object]) -> None:
    """Run a ``pycon`` block as a doctest (its outputs are checked) in ``namespace``."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.code, namespace, block.where, block.page, block.code_line - 1)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    out: list[str] = []
    runner.run(test, out=out.append, clear_globs=False)
    if runner.failures:
        raise AssertionError("".join(out))


def run_in_process(blocks: list[Block]) -> list[str]:
    """Run the unmarked blocks of one page in order in one fresh namespace; one message per failing block.

    A block after a failing one still runs (it may not need what failed), so every broken block is reported.
    """
    namespace: dict[str, object] = {"__name__": "__main__"}
    failures = []
    for block in blocks:
        if block.mode != "run":
            continue
        try:
            if block.language == "pycon" or block.code.lstrip().startswith(">>>"):
                _doctest(block, namespace)
            else:
                exec(compile(block.padded(), block.page, "exec"), namespace)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
            failures.append(
                f"{block.where}: this python block does not run (fix it, or mark it `.. fragment: <reason>`):\n{tail}"
            )
    return failures


def check_fragments(blocks: list[Block]) -> list[str]:
    """What can be checked of a fragment without running it: it parses, and its imports from the package work.

    A fragment is not run, but a renamed class or a removed function in its imports still shows here.
    """
    failures = []
    for block in blocks:
        if block.mode != "fragment" or block.include is not None:
            continue
        try:
            tree = ast.parse(block.padded(), block.page)
        except SyntaxError as exc:
            failures.append(f"{block.where}: this fragment is not valid Python: {exc}")
            continue
        for node in tree.body:
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [module or ""]
            if not any(name.split(".")[0] == "torchmetrics_diff" for name in names):
                continue
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), block.page, "exec"), {})
            except Exception as exc:
                failures.append(f"{block.where}: this fragment's import fails (line {node.lineno}): {exc!r}")
    return failures


def joined_script(blocks: list[Block]) -> str:
    """The page's blocks as one script whose lines are the page's lines (for a traceback that names them)."""
    lines: list[str] = []
    for block in blocks:
        code = block.code.splitlines()
        start = block.code_line - 1
        if len(lines) > start:
            raise ValueError(f"{block.where}: blocks overlap")
        lines.extend([""] * (start - len(lines)))
        lines.extend(code)
    return "\n".join(lines) + "\n"


def run_command(cmd: list[str], cwd: Path, timeout_s: float, root: Path) -> tuple[int, str]:
    """Run ``cmd`` in a new session with the repository on ``PYTHONPATH``; kill the whole group on a timeout.

    Returns:
        The exit status (``-9`` after a timeout) and the combined output.
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PYTHONWARNINGS": "ignore",
        # Accelerate on a machine without GPUs runs each torchrun process alone unless told to use the CPUs (what
        # `accelerate launch --cpu` sets); with it, the Accelerate page's blocks run on two gloo processes
        "ACCELERATE_USE_CPU": "true",
    }
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, f"killed after {timeout_s:.0f}s\n{out}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


RUN_TO_EXIT = Path(__file__).with_name("run_to_exit.py")


def torchrun_command(script: Path, *args: str, nproc: int = NPROC) -> list[str]:
    """``torchrun --standalone --nproc-per-node=2 script args`` with this interpreter, through :mod:`run_to_exit`
    (which fails a program whose gloo threads outlive ``destroy_process_group()``)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        str(RUN_TO_EXIT),
        str(script),
        *args,
    ]
