"""The alpha-beta model of a call's protocol overhead at W = 8 ... 4096 ranks (docs/guide/scaling.rst).

What a steady call of the package adds to the data's own collective, old protocol (every rank's 2 KiB header,
all-gathered over gloo, every call) against the new one (a fingerprint reduced by recursive doubling over
point-to-point, every rank's header only when something changed). Latency ``alpha`` per message, bandwidth
``beta``; the host work is what ``bench_scale.py`` measured in the simulated world (pass ``--host-us`` to plug in
another figure). gloo's all-gather is a ring: ``W - 1`` steps, each rank receiving ``(W - 1)`` headers.

Usage: ``python benchmarks/scaling_model.py [--alpha-us 20] [--beta-gbs 10] [--host-us 200]``
"""

from __future__ import annotations

import argparse
import math

WORLDS = (8, 64, 256, 512, 1024, 4096)
HEADER_BYTES = 2048  # the old protocol's header + smallest inline area, per rank and call
FINGERPRINT_BYTES = 88  # 11 int64
# the old protocol's host work to read W headers (tolist of the table, checks, payload lists), us, measured at
# W = 64 / 512 / 4096 with a local table standing in for the network; interpolated in log W between them
OLD_PARSE_US = {64: 500.0, 512: 2000.0, 4096: 56000.0}


def _old_parse(world: int) -> float:
    points = sorted(OLD_PARSE_US.items())
    if world <= points[0][0]:
        return points[0][1] * world / points[0][0]
    for (w0, t0), (w1, t1) in zip(points, points[1:]):
        if world <= w1:
            f = (math.log(world) - math.log(w0)) / (math.log(w1) - math.log(w0))
            return t0 * (t1 / t0) ** f
    return points[-1][1] * world / points[-1][0]


def rounds(world: int) -> int:
    """Exchange rounds of the fingerprint: log2 of the largest power of two <= W, plus 2 when W is not one."""
    low = 1 << (world.bit_length() - 1)
    return int(math.log2(low)) + (2 if low != world else 0)


def old_us(world: int, alpha_us: float, beta_gbs: float) -> float:
    ring = (world - 1) * alpha_us + (world - 1) * HEADER_BYTES / (beta_gbs * 1e3)
    return ring + _old_parse(world)


def new_us(world: int, alpha_us: float, beta_gbs: float, host_us: float) -> float:
    return rounds(world) * (alpha_us + FINGERPRINT_BYTES / (beta_gbs * 1e3)) + host_us


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha-us", type=float, default=20.0, help="latency of one TCP message (us)")
    parser.add_argument("--beta-gbs", type=float, default=10.0, help="host-to-host bandwidth (GB/s)")
    parser.add_argument("--host-us", type=float, default=200.0, help="the package's host work per call (us)")
    args = parser.parse_args(argv)
    print(f"alpha = {args.alpha_us:g} us per message, beta = {args.beta_gbs:g} GB/s, new host work {args.host_us:g} us")
    print(f"{'W':>6} | {'old: ring of 2 KiB headers + parse':>36} | {'new: fingerprint rounds + host':>32} | rounds")
    for world in WORLDS:
        old = old_us(world, args.alpha_us, args.beta_gbs)
        new = new_us(world, args.alpha_us, args.beta_gbs, args.host_us)
        print(f"{world:>6} | {old / 1e3:>33.2f} ms | {new / 1e3:>29.2f} ms | {rounds(world):>6}")


if __name__ == "__main__":
    main()
