"""Math as MathML, converted at build time: the pages show their formulas offline, without a script or a CDN.

Sphinx's default renderer loads MathJax from a CDN and shows raw TeX where that cannot be reached. This
renderer converts the TeX of every ``.. math::`` block and ``:math:`` role with docutils' own LaTeX-to-MathML
converter (``docutils.utils.math.latex2mathml``, no dependency beyond docutils) and writes the MathML into the
page, which browsers render natively. TeX the converter does not know is a build warning (an error under
``-W``) naming the document, and the page shows the TeX as code.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.utils.math import latex2mathml
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.math import get_node_equation_number

logger = logging.getLogger(__name__)


def tex_to_mathml(tex: str, block: bool) -> str:
    """The MathML of ``tex`` (raises ``latex2mathml.MathError`` on TeX the converter does not support)."""
    return latex2mathml.tex2mathml(tex, as_block=block)


def _convert(translator: Any, node: nodes.Element, tex: str, block: bool) -> str:
    try:
        return tex_to_mathml(tex, block)
    except latex2mathml.MathError as err:
        logger.warning("math cannot be converted to MathML: %s: %s", err, tex.strip(), location=node)
        return f"<code>{translator.encode(tex)}</code>"


def visit_math(translator: Any, node: nodes.math) -> None:
    translator.body.append(translator.starttag(node, "span", "", CLASS="math notranslate"))
    translator.body.append(_convert(translator, node, node.astext(), block=False))
    translator.body.append("</span>")
    raise nodes.SkipNode


def visit_math_block(translator: Any, node: nodes.math_block) -> None:
    translator.body.append(translator.starttag(node, "div", CLASS="math notranslate"))
    if node["number"]:
        number = get_node_equation_number(translator, node)
        translator.body.append(f'<span class="eqno">({number})')
        translator.add_permalink_ref(node, "Link to this equation")
        translator.body.append("</span>")
    parts = [p for p in node.astext().split("\n\n") if p.strip()]  # a blank line separates equations
    for part in parts:
        translator.body.append(_convert(translator, node, part, block=True))
    translator.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_math_block, None))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
