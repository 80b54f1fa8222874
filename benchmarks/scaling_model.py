"""The alpha-beta model of a call's protocol overhead at W = 8 ... 4096 ranks (docs/guide/scaling.rst).

What a steady call of the package adds to the data's own collective, old protocol (every rank's 2 KiB header,
all-gathered over gloo, every call) against the new one (a fingerprint reduced by recursive doubling over
point-to-point, every rank's header only when something changed). Latency ``alpha`` per message, bandwidth
``beta``; the host work is what ``bench_scale.py`` measured in the simulated world (pass ``--host-us`` to plug in
another figure). gloo's all-gather is a ring: ``W - 1`` steps, each rank receiving ``(W - 1)`` headers.

``--first`` adds a second table, by ``W``:

- a *first call* (or a change of shapes, a mismatch, a failure: every rank's 512-byte header): the old exchange,
  gloo's ring all-gather (``W - 1`` hops), against the new one, a log-depth all-gather over point-to-point
  messages with the fingerprint's partners (:func:`rounds` hops, the bytes doubling each round); network time
  only for the new one (its host work is measured in the simulated world, ``bench_scale.py``);
- what one gloo group costs when it is made: TCP connections per rank (a full mesh, gloo's eager connection,
  against the twin's lazy connection to its partners) and the store traffic of the full mesh's rendezvous, where
  each rank reads every rank's address blob of :data:`BLOB_BASE` + :data:`BLOB_PER_RANK` x ``W`` bytes;
- a failure's propagation: the hops of the notices that tell every survivor that a rank left.

Usage: ``python benchmarks/scaling_model.py [--alpha-us 20] [--beta-gbs 10] [--host-us 200] [--first]``
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

WORLDS = (8, 64, 256, 512, 1024, 4096)
HEADER_BYTES = 2048  # the old protocol's header + smallest inline area, per rank and call
FINGERPRINT_BYTES = 88  # 11 int64
FULL_HEADER_BYTES = 512  # every rank's header at a first call in a fingerprint group (no inline area)
# gloo's address blob that each rank writes to the store when a group is made eagerly, and that every rank reads
# for every rank: 154 + 8 W bytes (torch 2.13, measured at W = 2, 4, 8 and 16 through a store that records what it
# serves; 33 KB at W = 4096). A lazy group reads none when it is made.
BLOB_BASE, BLOB_PER_RANK = 154, 8
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


def ring_gather_us(world: int, n: int, alpha_us: float, beta_gbs: float) -> float:
    """gloo's ring all-gather of ``n`` bytes per rank: ``W - 1`` hops of ``n`` bytes."""
    return (world - 1) * (alpha_us + n / (beta_gbs * 1e3))


def log_gather_us(world: int, n: int, alpha_us: float, beta_gbs: float) -> float:
    """The log-depth all-gather of ``n`` bytes per rank (``_hosts.all_gather``), along its longest path: with
    ``L`` the largest power of two <= W, round ``k`` moves ``2^k`` slots; a slot is one block, two when ``W > L``,
    where an extra rank hands its block over first and receives the whole table last."""
    low = 1 << (world.bit_length() - 1)
    slot = n if low == world else 2 * n
    hops = [slot << k for k in range(low.bit_length() - 1)]
    if low != world:
        hops = [n, *hops, world * n]
    return sum(alpha_us + b / (beta_gbs * 1e3) for b in hops)


def partners(world: int) -> int:
    """The most partners a rank has in the log-depth exchanges: the lazy twin's connections per rank."""
    low = 1 << (world.bit_length() - 1)
    return low.bit_length() - 1 + (1 if low != world else 0)


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def first_call_table(alpha_us: float, beta_gbs: float) -> list[tuple[str, list[str]]]:
    """The rows of ``--first``: a label and one cell per W of :data:`WORLDS`."""
    n = FULL_HEADER_BYTES

    def each(cell: Callable[[int], str]) -> list[str]:
        return [cell(w) for w in WORLDS]

    def ms(us: float) -> str:
        return f"{us / 1e3:.2f} ms"

    def blob(w: int) -> int:
        return BLOB_BASE + BLOB_PER_RANK * w

    return [
        ("first call: hops, old (gloo's ring)", each(lambda w: str(w - 1))),
        ("first call: hops, new (log-depth)", each(lambda w: str(rounds(w)))),
        ("first call, old: ring, network", each(lambda w: ms(ring_gather_us(w, n, alpha_us, beta_gbs)))),
        (
            "first call, old: ring + parse (old model)",
            each(lambda w: ms(ring_gather_us(w, n, alpha_us, beta_gbs) + _old_parse(w))),
        ),
        ("first call, new: network (+ host work)", each(lambda w: ms(log_gather_us(w, n, alpha_us, beta_gbs)))),
        ("connections per rank, eager (full mesh)", each(lambda w: str(w - 1))),
        ("connections per rank, lazy twin (partners)", each(lambda w: str(partners(w)))),
        ("store reads per rank at creation, eager", each(lambda w: _bytes(w * blob(w)))),
        ("store traffic served at creation, eager", each(lambda w: _bytes(w * w * blob(w)))),
        ("a failure's propagation: notice hops", each(lambda w: str(rounds(w)))),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha-us", type=float, default=20.0, help="latency of one TCP message (us)")
    parser.add_argument("--beta-gbs", type=float, default=10.0, help="host-to-host bandwidth (GB/s)")
    parser.add_argument("--host-us", type=float, default=200.0, help="the package's host work per call (us)")
    parser.add_argument(
        "--first",
        action="store_true",
        help="also print a first call's cost, a gloo group's connections and store traffic at creation, and a "
        "failure's propagation",
    )
    args = parser.parse_args(argv)
    print(f"alpha = {args.alpha_us:g} us per message, beta = {args.beta_gbs:g} GB/s, new host work {args.host_us:g} us")
    print(f"{'W':>6} | {'old: ring of 2 KiB headers + parse':>36} | {'new: fingerprint rounds + host':>32} | rounds")
    for world in WORLDS:
        old = old_us(world, args.alpha_us, args.beta_gbs)
        new = new_us(world, args.alpha_us, args.beta_gbs, args.host_us)
        print(f"{world:>6} | {old / 1e3:>33.2f} ms | {new / 1e3:>29.2f} ms | {rounds(world):>6}")
    if args.first:
        print()
        print(f"a first call (every rank's {FULL_HEADER_BYTES}-byte header), a gloo group's making, a departure")
        rows = first_call_table(args.alpha_us, args.beta_gbs)
        width = max(len(label) for label, _ in rows)
        print(f"{'W':<{width}} | " + " | ".join(f"{w:>9}" for w in WORLDS))
        for label, cells in rows:
            print(f"{label:<{width}} | " + " | ".join(f"{c:>9}" for c in cells))


if __name__ == "__main__":
    main()
