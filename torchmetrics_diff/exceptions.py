"""The package's own exception types.

Every one subclasses ``RuntimeError``, so ``except RuntimeError`` keeps working (``ShapeMismatchError`` is a
``ValueError`` too, as it was before it had a class of its own)::

    ValueError, RuntimeError
    └── ShapeMismatchError         inputs that must have one shape do not (preds/target, two views, ...)

    RuntimeError
    ├── TorchMetricsUserError      a metric used out of order (forward while synced, sync twice, ...)
    └── DistributedError           a call that communicates failed because of the other ranks
        ├── CollectiveError        the collective itself failed: a timeout, a backend error
        │   └── PeerLeftError      a peer's process exited or lost its connection during the call
        ├── PeerFailedError        a peer raised its own error first and joined only to say so
        └── RanksDisagreeError     the ranks disagree on the call's metadata, or are in different calls
            └── AccumulationMismatchError  different numbers of micro-batch calls in an accumulation step

The distributed ones are defined in ``torchmetrics_diff.distributed._failure`` (the bottom of the package, which
every layer may import) and belong here: import them from this module.

Example:
    >>> from torchmetrics_diff.exceptions import DistributedError, PeerLeftError
    >>> issubclass(PeerLeftError, DistributedError) and issubclass(PeerLeftError, RuntimeError)
    True
"""

from __future__ import annotations

from torchmetrics_diff.distributed._failure import (
    CollectiveError,
    DistributedError,
    PeerFailedError,
    PeerLeftError,
    RanksDisagreeError,
)
from torchmetrics_diff.functional._errors import ShapeMismatchError

__all__ = [
    "AccumulationMismatchError",
    "CollectiveError",
    "DistributedError",
    "PeerFailedError",
    "PeerLeftError",
    "RanksDisagreeError",
    "ShapeMismatchError",
    "TorchMetricsUserError",
]


class TorchMetricsUserError(RuntimeError):
    """A metric used out of order: ``forward``/``update`` while synced, ``sync`` twice, ``unsync`` unsynced.

    The name and meaning follow torchmetrics' exception of the same name; it subclasses ``RuntimeError``, so
    ``except RuntimeError`` keeps working.
    """


class AccumulationMismatchError(RanksDisagreeError):
    """The ranks broke the accumulation protocol of a normalized loss: they planned or made different numbers of
    micro-batch calls in an :meth:`~torchmetrics_diff.losses.GlobalMeanLoss.accumulate` step, or were at different
    steps of a :meth:`~torchmetrics_diff.losses.GlobalMeanLoss.flat_accumulation` block.

    Found in the header exchange the calls make anyway (or the collective that sums the step's weight), so every
    rank raises it at once, naming what each rank was doing; the ranks are in step again afterwards. A
    :class:`~torchmetrics_diff.exceptions.RanksDisagreeError`, so ``except RanksDisagreeError`` catches it too.
    """
