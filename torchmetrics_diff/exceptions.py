"""The package's own exception types."""

from __future__ import annotations


class TorchMetricsUserError(RuntimeError):
    """A metric used out of order: ``forward``/``update`` while synced, ``sync`` twice, ``unsync`` unsynced.

    The name and meaning follow torchmetrics' exception of the same name; it subclasses ``RuntimeError``, so
    ``except RuntimeError`` keeps working.
    """
