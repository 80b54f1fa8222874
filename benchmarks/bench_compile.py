"""A training step of a small two-tower model with ``CLIPLoss``: eager vs ``torch.compile`` (docs/guide/compile.rst).

Each rank runs the same step (two ``Linear -> GELU -> Linear`` towers, normalized embeddings, learned logit scale,
``CLIPLoss`` over every rank's rows, ``backward``, SGD update) eagerly and compiled (``inductor`` and the ``eager``
backend, which shows Dynamo's own cost: guards, graph breaks). Reported per world size: the median step time of
each, the compile (warm-up) time, and the frames Dynamo compiled during the timed steps, which must be none: a
recompile per step would show up there, and after 8 of them Dynamo runs the whole step eagerly.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from _timing import Budget, Check, fx, ms, ratio, run_spawned, table, time_dist, time_local
from torch import nn

D_IN, D_HID, D_EMB, ROWS = 64, 128, 32, 64  # per rank: ROWS samples, towers D_IN -> D_HID -> D_EMB
BACKENDS = {"inductor": "inductor", "eager_backend": "eager"}  # column -> torch.compile backend


class TwoTower(nn.Module):
    """Image and text towers with a learned logit scale, as in CLIP."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.image = nn.Sequential(nn.Linear(D_IN, D_HID), nn.GELU(), nn.Linear(D_HID, D_EMB))
        self.text = nn.Sequential(nn.Linear(D_IN, D_HID), nn.GELU(), nn.Linear(D_HID, D_EMB))
        self.log_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x_img: torch.Tensor, x_txt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        img = nn.functional.normalize(self.image(x_img), dim=-1)
        txt = nn.functional.normalize(self.text(x_txt), dim=-1)
        return img, txt, self.log_scale.exp()


def _worker(rank: int, world: int, budget: Budget, strategy: str) -> dict:
    from torch._dynamo.utils import counters

    from torchmetrics_diff.losses import CLIPLoss

    gen = torch.Generator().manual_seed(rank)
    x_img, x_txt = torch.randn(ROWS, D_IN, generator=gen), torch.randn(ROWS, D_IN, generator=gen)

    def make(backend: str | None) -> Any:
        model, loss = TwoTower(), CLIPLoss(strategy=strategy)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return loss(*model(a, b))

        fwd = forward if backend is None else torch.compile(forward, backend=backend)

        def step() -> None:
            fwd(x_img, x_txt).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    steps = {"eager": make(None)}
    compile_s = {}
    for name, backend in BACKENDS.items():
        steps[name] = make(backend)
        t0 = time.perf_counter()
        for _ in range(3):  # the first call compiles; the next two would recompile if a guard changed per step
            steps[name]()
        compile_s[name] = time.perf_counter() - t0
    counters.clear()
    timed = time_dist(steps, budget) if world > 1 else time_local(steps, budget)
    return {"times": timed, "compile_s": compile_s, "new_frames": counters["frames"]["total"]}


def main(args: Any) -> list[Check]:
    quick = getattr(args, "quick", False)
    budget = Budget(repeats=5, block_s=0.05, warmup=3) if quick else Budget(repeats=11, block_s=0.2, warmup=5)
    worlds = (2,) if quick else (1, 2)
    rows, checks = [], []
    for world in worlds:
        res = run_spawned(_worker, world, budget, "sharded", timeout=900)
        t, compile_s = res["times"], res["compile_s"]
        rows.append(
            [
                world,
                ms(t["eager"]),
                ms(t["inductor"]),
                fx(ratio(t["eager"], t["inductor"])),
                ms(t["eager_backend"]),
                f"{compile_s['inductor']:.1f}",
                res["new_frames"],
            ]
        )
        checks.append(
            Check(
                f"compiled CLIP step W={world}: frames compiled during the timed steps", res["new_frames"], "<=", 0, ""
            )
        )
    print(
        table(
            f"Training step: two towers {D_IN}->{D_HID}->{D_EMB} + CLIPLoss(sharded), {ROWS} rows per rank, float32",
            ["W", "eager ms", "inductor ms", "speed-up", "backend=eager ms", "inductor compile s", "new frames"],
            rows,
            [
                "step = towers, loss, backward, SGD update; only the forward (model + loss) is compiled",
                "backend=eager: Dynamo without a compiler (its guards and graph breaks, no kernel fusion)",
                "new frames: frames Dynamo compiled during the timed steps (a recompile would be one); must be 0",
                "W=1: no process group, no graph break; W=2: one break, at the gather (docs/guide/compile.rst)",
            ],
        )
    )
    return checks
