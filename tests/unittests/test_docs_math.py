"""The formulas of the docs render offline: every ``.. math::`` block and ``:math:`` role, in the pages and in the
package's docstrings, converts to MathML with the converter the Sphinx build uses (``docs/_ext/mathml.py``), and
the build uses it instead of MathJax from a CDN."""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytest.importorskip("sphinx")
pytest.importorskip("docutils.utils.math.latex2mathml")


def _extension():
    spec = importlib.util.spec_from_file_location("_docs_mathml", DOCS / "_ext" / "mathml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _formulas(text: str) -> list[tuple[str, bool]]:
    """``(tex, block)`` of every math directive (one per blank-line-separated part) and math role in ``text``."""
    out = [(m.group(1), False) for m in re.finditer(r":math:`([^`]+)`", text)]
    lines = text.splitlines()
    for i, line in enumerate(lines):
        directive = re.match(r"(\s*)\.\. math::\s*(.*)$", line)
        if not directive:
            continue
        indent, body = len(directive.group(1)), [directive.group(2)]
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        content = textwrap.dedent("\n".join(b for b in body if not b.strip().startswith(":")))
        out += [(part, True) for part in content.split("\n\n") if part.strip()]
    return out


def _sources() -> list[Path]:
    return sorted(DOCS.rglob("*.rst")) + sorted((ROOT / "torchmetrics_diff").rglob("*.py"))


FORMULAS = [
    (f"{path.relative_to(ROOT)}:{i}", tex, block)
    for path in _sources()
    for i, (tex, block) in enumerate(_formulas(path.read_text(encoding="utf-8")))
]


def test_the_docs_have_formulas() -> None:
    names = {name.split(":")[0] for name, _, _ in FORMULAS}
    assert (
        len(FORMULAS) >= 10 and "docs/losses/clip.rst" in names and "torchmetrics_diff/losses/contrastive.py" in names
    )


@pytest.mark.parametrize(("tex", "block"), [pytest.param(t, b, id=n) for n, t, b in FORMULAS])
def test_formula_converts_to_mathml(tex: str, block: bool) -> None:
    mathml = _extension().tex_to_mathml(tex, block)
    assert mathml.startswith("<math") and mathml.rstrip().endswith("</math>")
    assert ('display="block"' in mathml) == block


def test_an_unsupported_command_is_an_error() -> None:
    """The converter rejects what it cannot draw (the build turns it into a warning, an error under -W)."""
    from docutils.utils.math.latex2mathml import MathError

    with pytest.raises(MathError):
        _extension().tex_to_mathml(r"\big( x \big)", True)


def test_the_build_renders_math_as_mathml_without_a_cdn() -> None:
    conf = (DOCS / "conf.py").read_text(encoding="utf-8")
    assert re.search(r'^html_math_renderer = "mathml"$', conf, re.M)
    assert re.search(r'^\s+"mathml",$', conf, re.M)
    # no MathJax and nothing fetched at build or view time (intersphinx's URLs are link targets: its inventories
    # are local files)
    assert "mathjax_path" not in conf and "mathjax3_config" not in conf
    mappings = re.findall(r'\("(https?://[^"]+)", "([^"]+)"\)', conf)
    assert mappings, "docs/conf.py names no intersphinx mapping: the pattern no longer matches it"
    for target, inventory in mappings:
        assert not inventory.startswith("http") and (DOCS / inventory).is_file(), (target, inventory)
