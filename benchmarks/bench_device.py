"""The losses against open_clip on one GPU: CLIP and SigLIP, forward + backward per step, one process (W = 1).

Run by ``benchmarks/device_check.sh`` (``make test-cuda``); ``python benchmarks/bench_device.py`` alone prints the
same table. Ours is ``global_clip_loss`` / ``global_siglip_loss`` with ``strategy="sharded"`` (at one process
the sharded code path without communication) and ``strategy="ring"``; the anchors are open_clip's ``ClipLoss``
and ``SigLipLoss`` (loaded from their file, as in ``bench_anchors.py``; a column reads n/a where open_clip is not
installed). Unit-norm float32 embeddings of D = 512 on ``cuda:0``, N rows, logit scale 10 (SigLIP bias -10).

Timing: CUDA events around each step on the current stream, after warm-up steps; the median of the timed steps.
Memory: the peak of ``torch.cuda.max_memory_allocated`` during one step above what was allocated before it.
The value column is the largest difference between our loss and open_clip's (both compute the same mean).

Without CUDA it prints one line saying so and does nothing else (``make bench`` finds it too).
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Callable

import torch
from _timing import Check, open_clip_loss, table

D = 512
SIZES = (4096, 16384)
QUICK_SIZES = (4096,)
WARMUP, STEPS = 3, 10
SKIP_LINE = "bench_device skipped: no CUDA device (torch.cuda.is_available() is False)"


def _unit(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    x = torch.randn(n, D, generator=gen).to(device)
    return torch.nn.functional.normalize(x, dim=1).requires_grad_()


def _steps(pair: str, n: int, device: torch.device) -> dict[str, Callable[[], torch.Tensor]]:
    """``{side: step}``: each returns the loss of one forward (the caller runs backward)."""
    from torchmetrics_diff.functional import global_clip_loss, global_siglip_loss

    gen = torch.Generator().manual_seed(n)
    img, txt = _unit(n, gen, device), _unit(n, gen, device)
    scale = torch.full((), 10.0, device=device, requires_grad=True)
    bias = torch.full((), -10.0, device=device, requires_grad=True)
    try:
        oc = open_clip_loss()
    except Exception:  # not installed, or its module does not load beside this torch: the column reads n/a
        oc = None
    if pair == "clip":
        steps = {s: (lambda s=s: global_clip_loss(img, txt, scale, strategy=s)) for s in ("sharded", "ring")}
        if oc is not None:
            anchor = oc.ClipLoss(rank=0, world_size=1)
            steps["open_clip"] = lambda: anchor(img, txt, scale)
        return steps
    steps = {s: (lambda s=s: global_siglip_loss(img, txt, scale, bias, strategy=s)) for s in ("sharded", "ring")}
    if oc is not None:
        anchor = oc.SigLipLoss(rank=0, world_size=1)
        steps["open_clip"] = lambda: anchor(img, txt, scale, bias)
    return steps


def _measure(step: Callable[[], torch.Tensor], device: torch.device) -> dict[str, Any]:
    """Median milliseconds per forward + backward (CUDA events), peak MiB above the start, the last value."""
    for _ in range(WARMUP):
        step().backward()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(STEPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        loss.backward()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    value = step()
    value.backward()
    torch.cuda.synchronize(device)
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    return {"ms": statistics.median(times), "mib": peak, "value": float(value.detach())}


def run(sizes: tuple[int, ...] = SIZES) -> str:
    """Every pair at every size on ``cuda:0``; the markdown table."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    rows = []
    for pair in ("clip", "siglip"):
        for n in sizes:
            results = {side: _measure(step, device) for side, step in _steps(pair, n, device).items()}
            anchor = results.get("open_clip")
            for side in ("sharded", "ring"):
                ours = results[side]
                rows.append(
                    [
                        f"{'CLIP' if pair == 'clip' else 'SigLIP'} {side}",
                        n,
                        f"{ours['ms']:.2f}",
                        f"{anchor['ms']:.2f}" if anchor else "n/a",
                        f"{ours['ms'] / anchor['ms']:.2f}x" if anchor else "n/a",
                        f"{ours['mib']:.0f}",
                        f"{anchor['mib']:.0f}" if anchor else "n/a",
                        f"{abs(ours['value'] - anchor['value']):.1e}" if anchor else "n/a",
                    ]
                )
    name = torch.cuda.get_device_name(device)
    return table(
        f"Losses on one GPU ({name}, torch {torch.__version__}), forward + backward, D = {D}, float32",
        ["loss", "N", "ours ms", "open_clip ms", "ratio", "ours MiB", "open_clip MiB", "|Δ value|"],
        rows,
        [
            f"median of {STEPS} steps after {WARMUP} warm-up steps, CUDA events; MiB: peak allocated during a step",
            "open_clip: ClipLoss / SigLipLoss at world_size=1 (n/a: open_clip_torch is not installed)",
        ],
    )


def main(args: Any = None) -> list[Check]:
    """The entry point of ``run_all.py``: the table on a GPU, one line without."""
    if not torch.cuda.is_available():
        print(SKIP_LINE)
        return []
    print(run(QUICK_SIZES if getattr(args, "quick", False) else SIZES))
    return []


if __name__ == "__main__":
    main(type("Args", (), {"quick": "--quick" in sys.argv[1:]})())
