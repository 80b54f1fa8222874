"""The ring strategy: per-rank loss memory and step time, ring vs sharded, and SigLIP vs open_clip.

Everything runs on real gloo ranks (W = 4, and W = 8 for the flatness check) on this machine's 2 cores, float32,
unit-norm embeddings of width D, a per-rank batch B = N / W, the loss's forward + backward:

1. *Memory*: each configuration in fresh processes, one step after a small warm-up step; a rank's peak is
   the rise of its resident set during the step (``VmHWM`` after resetting it through ``/proc/self/clear_refs``,
   above the RSS before the step; the inputs exist before). The reported peak is the largest over the ranks.
   Allocations of 64 KiB and more are their own mappings (``MALLOC_MMAP_THRESHOLD_``), so the resident set
   follows the live tensors.
2. *Time*: one set of W = 4 processes runs every configuration in turn, round after round (after a small
   warm-up), in the reverse order every other round; a configuration's time is rank 0's wall time of one step
   between barriers, and ratios are medians of per-round ratios (the load of the other engineers on the
   machine hits both sides of a round alike).

Anchors: ``CLIPLoss(strategy="sharded")`` (one (B, N) logit block, texts gathered) and open_clip's
``SigLipLoss(dist_impl="bidir")`` (its ``loss.py`` loaded from file without the package, which needs
torchvision; skipped with a message when open_clip is not installed).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from _timing import Check, fx, ms, open_clip_loss, run_spawned, table

from torchmetrics_diff._global.strategy import DEFAULT_TILE

N_BIG, D_BIG, W_BIG = 16384, 256, 4
TILE = DEFAULT_TILE  # the ring's default tile


# ----------------------------------------------------------------------------------------------- memory
def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (the peak resident set) to the current RSS
        return True
    except OSError:
        return False


def _peak_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _step_fn(kind: str, strategy: str, rank: int, world: int, n: int, d: int, tile: int) -> Callable[[], None]:
    """One forward + backward of the loss on this rank's B = n / world rows (leaf inputs, float32)."""
    gen = torch.Generator().manual_seed(1000 + rank)
    rows = n // world
    img = torch.nn.functional.normalize(torch.randn(rows, d, generator=gen), dim=1).requires_grad_()
    txt = torch.nn.functional.normalize(torch.randn(rows, d, generator=gen), dim=1).requires_grad_()
    scale = torch.tensor(10.0, requires_grad=True)
    bias = torch.tensor(-10.0, requires_grad=True)
    if kind == "clip":
        from torchmetrics_diff.losses import CLIPLoss

        loss = CLIPLoss(strategy=strategy, tile=tile if strategy == "ring" else None)
        return lambda: loss(img, txt, scale).backward()
    if strategy == "open_clip":
        oc = open_clip_loss().SigLipLoss(rank=rank, world_size=world, dist_impl="bidir")
        return lambda: oc(img, txt, scale, bias).backward()
    from torchmetrics_diff.losses import SigLIPLoss

    ours = SigLIPLoss(strategy=strategy, tile=tile if strategy == "ring" else None)
    return lambda: ours(img, txt, scale, bias).backward()


def _memory_worker(rank: int, world: int, kind: str, strategy: str, n: int, d: int, tile: int) -> dict:
    # a small step first: code pages, thread pools and the gloo pairs are touched once, outside the measurement
    _step_fn(kind, strategy, rank, world, 64 * world, d, tile)()
    step = _step_fn(kind, strategy, rank, world, n, d, tile)
    dist.barrier()
    baseline = _rss_mib()
    exact = _reset_peak()
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    peak = _peak_mib() - baseline if exact else float("nan")
    peaks: list[Any] = [None] * world
    dist.all_gather_object(peaks, peak)
    return {"peak_mib": max(peaks), "per_rank": peaks, "seconds": seconds}


def _time_worker(rank: int, world: int, configs: dict[str, tuple], d: int, tile: int, rounds: int) -> dict:
    for kind, strategy, _ in configs.values():  # warm-up on a small batch
        _step_fn(kind, strategy, rank, world, 64 * world, d, tile)()
    steps = {name: _step_fn(kind, strategy, rank, world, n, d, tile) for name, (kind, strategy, n) in configs.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:  # alternate the order: drift in the load cancels
            step = steps[name]
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    return times


# ------------------------------------------------------------------------------------------ W = 4 exact
EXACT_SIZES = (3, 0, 5, 2)  # uneven, one empty rank


def _exact_inputs(n: int, d: int = 4) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    f64 = torch.float64
    return {
        "a": torch.randn(n, d, generator=gen, dtype=f64),
        "b": torch.randn(n, d, generator=gen, dtype=f64),
        "labels": torch.randint(0, 3, (n,), generator=gen),
        "scale": torch.tensor(3.0, dtype=f64),
        "bias": torch.tensor(-1.0, dtype=f64),
    }


def _exact_loss(kind: str, x: dict[str, torch.Tensor], fn: dict[str, Callable]) -> torch.Tensor:
    if kind == "clip":
        return fn["clip"](x["a"], x["b"], x["scale"])
    if kind == "siglip":
        return fn["siglip"](x["a"], x["b"], x["scale"], x["bias"])
    if kind == "infonce":
        return fn["infonce"](x["a"], x["b"], x["scale"])
    return fn["supcon"](x["a"], x["labels"], x["scale"])


def _exact_worker(rank: int, world: int, sizes: tuple[int, ...]) -> dict:
    """Every ring loss on ``world`` ranks (``grad_reduction="sum"``): each rank's input gradients, the scale's sum."""
    from torchmetrics_diff import functional as F

    ring = {"strategy": "ring", "grad_reduction": "sum"}
    fn = {
        "clip": lambda a, b, s: F.global_clip_loss(a, b, s, **ring, tile=2),
        "siglip": lambda a, b, s, c: F.global_siglip_loss(a, b, s, c, **ring, tile=2),
        "infonce": lambda a, b, t: F.global_info_nce_loss(a, b, t, **ring, tile=3),
        "supcon": lambda a, y, t: F.global_supcon_loss(a, y, t, **ring, tile=2),
    }
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    out = {}
    for kind in fn:
        full = _exact_inputs(sum(sizes))
        x = {k: (v[lo:hi] if v.ndim else v).clone() for k, v in full.items()}
        for k in ("a", "b", "scale", "bias"):
            x[k].requires_grad_()
        value = _exact_loss(kind, x, fn)
        value.backward()
        grads = [
            torch.zeros_like(x[k]) if x[k].grad is None else x[k].grad.clone() for k in ("a", "b", "scale", "bias")
        ]
        dist.all_reduce(grads[2])  # the summing trainer
        dist.all_reduce(grads[3])
        every: list[Any] = [None] * world
        dist.all_gather_object(every, (float(value), [g.tolist() for g in grads]))  # plain lists leave the process
        out[kind] = every
    return out


def _reference_losses() -> dict[str, Callable]:
    """Plain single-process formulas over the full logit matrices (torch only, not this package)."""
    import torch.nn.functional as F

    def clip(a, b, s):
        logits = s * a @ b.T
        target = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2

    def siglip(a, b, s, c):
        z = 2 * torch.eye(a.shape[0], dtype=a.dtype) - 1
        return -F.logsigmoid(z * (s * a @ b.T + c)).sum() / a.shape[0]

    def infonce(a, b, t):
        z = F.normalize(torch.cat([a, b]), dim=1)
        n = a.shape[0]
        logits = (z @ z.T / t).masked_fill(torch.eye(2 * n, dtype=torch.bool), -torch.inf)
        return F.cross_entropy(logits, torch.cat([torch.arange(n, 2 * n), torch.arange(n)]))

    def supcon(a, y, t):
        z = F.normalize(a, dim=1)
        eye = torch.eye(a.shape[0], dtype=torch.bool)
        log_prob = torch.log_softmax((z @ z.T / t).masked_fill(eye, -torch.inf), dim=1)
        pos = (y[:, None] == y[None, :]) & ~eye
        has = pos.any(dim=1)
        per = -(log_prob.masked_fill(~pos, 0.0)).sum(dim=1)[has] / pos.sum(dim=1)[has]
        return per.mean()

    return {"clip": clip, "siglip": siglip, "infonce": infonce, "supcon": supcon}


def _exact_errors(per_kind: dict, sizes: tuple[int, ...]) -> dict[str, float]:
    """Largest relative difference of value and gradients from the reference, per loss."""
    errors = {}
    for kind, every in per_kind.items():
        full = _exact_inputs(sum(sizes))
        for k in ("a", "b", "scale", "bias"):
            full[k].requires_grad_()
        value = _exact_loss(kind, full, _reference_losses())
        value.backward()
        value = float(value.detach())
        ref_grads = {k: torch.zeros_like(full[k]) if full[k].grad is None else full[k].grad for k in ("a", "b")}
        ref_grads.update({k: torch.zeros(()) if full[k].grad is None else full[k].grad for k in ("scale", "bias")})
        worst = max(abs(v - value) for v, _ in every) / max(1.0, abs(value))
        for rank, (_, grads) in enumerate(every):
            lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
            want = [ref_grads["a"][lo:hi], ref_grads["b"][lo:hi], ref_grads["scale"], ref_grads["bias"]]
            for got, ref in zip(grads, want):
                got = torch.tensor(got, dtype=torch.float64)
                if ref.numel():
                    worst = max(worst, float((got - ref).abs().max()) / max(1.0, float(ref.abs().max())))
        errors[kind] = worst
    return errors


def _paired(times: dict[str, list[float]], a: str, b: str) -> float | None:
    if a not in times or b not in times:
        return None
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


# ------------------------------------------------------------------------------------------------- main
def main(args: Any) -> list[Check]:
    quick = getattr(args, "quick", False)
    n, d, w = (4096, 128, W_BIG) if quick else (N_BIG, D_BIG, W_BIG)
    small = n // 4
    rounds = 2 if quick else 4
    try:
        open_clip_loss()
        have_open_clip = True
    except ImportError:
        have_open_clip = False
    if not have_open_clip:
        print("bench_ring: open_clip is not installed (pip install open_clip_torch --no-deps); its rows read n/a\n")

    mem: dict[tuple, dict] = {}
    plan = [
        ("clip", "sharded", small, w),
        ("clip", "ring", small, w),
        ("clip", "sharded", n, w),
        ("clip", "ring", n, w),
        ("clip", "ring", 2 * n, 2 * w),  # N doubles at the same per-rank batch
        ("siglip", "ring", n, w),
    ]
    if have_open_clip:
        plan.append(("siglip", "open_clip", n, w))
    # memory runs: every allocation of 64 KiB or more is its own mapping, returned to the system when freed, so
    # the resident set follows the live tensors instead of what glibc's heap keeps (the spawned ranks inherit
    # this); the timing runs use glibc's defaults (a mapping per large tensor would charge page faults to time)
    previous = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    try:
        for kind, strategy, size, world in plan:
            mem[(kind, strategy, size, world)] = run_spawned(
                _memory_worker, world, kind, strategy, size, d, TILE, timeout=900.0
            )
    finally:
        if previous is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = previous
    configs = {
        f"clip-sharded-{small}": ("clip", "sharded", small),
        f"clip-ring-{small}": ("clip", "ring", small),
        f"clip-sharded-{n}": ("clip", "sharded", n),
        f"clip-ring-{n}": ("clip", "ring", n),
        f"siglip-ring-{n}": ("siglip", "ring", n),
    }
    if have_open_clip:
        configs[f"siglip-open_clip-{n}"] = ("siglip", "open_clip", n)
    times = run_spawned(_time_worker, w, configs, d, TILE, rounds, timeout=1200.0)
    exact = _exact_errors(run_spawned(_exact_worker, len(EXACT_SIZES), EXACT_SIZES, timeout=300.0), EXACT_SIZES)
    print(
        table(
            f"Ring exactness at W={len(EXACT_SIZES)}, rows {'/'.join(map(str, EXACT_SIZES))}, float64, tiles of 2-3",
            ["loss", "max relative error of value and gradients vs plain torch on the full batch"],
            [[k, f"{v:.1e}"] for k, v in exact.items()],
        )
    )

    def med(name: str) -> float | None:
        return statistics.median(times[name]) if name in times else None

    rows = []
    for kind, strategy, size, world in plan:
        m = mem[(kind, strategy, size, world)]
        name = f"{kind}-{strategy}-{size}"
        timed = med(name) if world == w else None
        rows.append(
            [
                f"{'SigLIP' if kind == 'siglip' else 'CLIP'} {strategy}",
                size,
                world,
                size // world,
                f"{m['peak_mib']:.0f}",
                " / ".join(f"{p:.0f}" for p in m["per_rank"]),
                ms(timed) if timed is not None else f"({m['seconds'] * 1e3:.0f} one step)",
            ]
        )
    print(
        table(
            f"Loss forward + backward per rank, D={d}, float32, tile={TILE} (ring)",
            ["loss / strategy", "N", "W", "B", "peak MiB (max rank)", "peak MiB per rank", "step ms (median)"],
            rows,
            [
                "peak = rise of the resident set during one step in fresh processes (VmHWM reset before the step)",
                f"step times: W={w}, {rounds} rounds after a small warm-up, all configurations in one set of "
                "processes, rank 0 between barriers",
                "the W=2W row ran in its own processes on the same 2 cores; its one-step time is not comparable",
            ],
        )
    )
    ratio_rows = [
        [
            size,
            fx(_paired(times, f"clip-ring-{size}", f"clip-sharded-{size}")),
            fx(mem[("clip", "ring", size, w)]["peak_mib"] / mem[("clip", "sharded", size, w)]["peak_mib"]),
        ]
        for size in (small, n)
    ]
    print(
        table(
            f"CLIP ring / sharded at W={w} (paired per-round time ratio; memory ratio)",
            ["N", "time ring/sharded", "peak ring/sharded"],
            ratio_rows,
        )
    )

    ring, sharded = mem[("clip", "ring", n, w)], mem[("clip", "sharded", n, w)]
    doubled = mem[("clip", "ring", 2 * n, 2 * w)]
    checks = [
        Check(f"CLIP ring peak / sharded peak, N={n} D={d} W={w}", ring["peak_mib"] / sharded["peak_mib"], "<=", 1 / 8),
        Check(
            f"CLIP ring peak, N={2 * n} W={2 * w} / N={n} W={w} (same B={n // w}): |ratio - 1|",
            abs(doubled["peak_mib"] / ring["peak_mib"] - 1),
            "<=",
            0.10,
        ),
        Check(
            f"CLIP ring step time / sharded, N={n} W={w}",
            _paired(times, f"clip-ring-{n}", f"clip-sharded-{n}"),
            "<=",
            1.5,
        ),
    ]
    checks.append(
        Check(
            f"ring W={len(EXACT_SIZES)} (uneven, empty rank) float64: max relative error of value and gradients x 1e12",
            max(exact.values()) * 1e12,
            "<=",
            1.0,
        )
    )
    oc = mem.get(("siglip", "open_clip", n, w))
    checks += [
        Check(
            f"SigLIP ring step time / open_clip SigLipLoss(bidir), N={n} W={w}",
            _paired(times, f"siglip-ring-{n}", f"siglip-open_clip-{n}"),
            "<=",
            1.0,
        ),
        Check(
            f"SigLIP ring peak / open_clip SigLipLoss(bidir) peak, N={n} W={w}",
            None if oc is None else mem[("siglip", "ring", n, w)]["peak_mib"] / oc["peak_mib"],
            "<=",
            0.5,
        ),
    ]
    return checks


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for check in main(parser.parse_args()):
        print(check.line())
