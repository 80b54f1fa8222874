"""Text metrics on the global batch."""

from __future__ import annotations

from torchmetrics_diff.text.perplexity import Perplexity

__all__ = ["Perplexity"]
