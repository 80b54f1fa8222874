"""Compatibility of the current tree with a baseline revision, both ways: pickles, state_dicts and public names.

Usage::

    python benchmarks/check_compat.py [--baseline REV]   # REV defaults to d2c2c41; exit 1 on any break

Objects: every public class of ``torchmetrics_diff.__all__`` and of the subpackages ``classification``,
``regression``, ``retrieval``, ``text``, ``losses``, ``wrappers`` (and ``aggregation``'s public classes) that builds
with defaults or simple arguments (a task class's generic name once per task), a ``MetricCollection`` of two
metrics (twice: regression, and binary classification), a ``CompositionalMetric`` and the wrappers around small
metrics; each gets two ``update`` calls of seeded inputs of its family. Classes without generic inputs are skipped
and listed with the reason.

- pickles: ``pickle.dumps`` after the updates in tree A, ``pickle.loads`` in tree B; the states (exactly) and
  ``compute()`` (to float rounding) must equal tree A's.
- state_dicts: ``persistent(True)`` then ``state_dict()``, ``torch.save``'d in A; ``torch.load(weights_only=True)``
  and ``load_state_dict`` (strict) into a fresh object in B; states and ``compute()`` compared as above. Objects
  whose ``state_dict`` holds nothing are skipped.
- public names: ``__all__`` of the package and of each public top-level submodule (without ``__all__``: its public
  names bound to objects of the package's public modules): none of the baseline's missing in the current tree;
  additions are listed, not counted as breaks.

Every load also runs within one tree (baseline->baseline, current->current) as a control: an object that fails
the round trip within each tree is listed as a limitation, not a compatibility mismatch. Each tree runs in its own
fresh subprocesses (PYTHONPATH set to the tree; the baseline is a temporary ``git worktree``, removed at the end),
exchanging files through a temporary folder: save in each tree, then load in each tree (four subprocesses, about
half a minute in all on two cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _baseline import DEFAULT_BASELINE, REPO, assert_imported_from, baseline_worktree, package_dirty, run_in_tree
from _baseline import short_hash as _short_hash

SIDES = ("baseline", "current")
CHECKS = ("pickle", "state_dict")
SUBPACKAGES = ("classification", "regression", "retrieval", "text", "aggregation", "losses", "wrappers", "collections")
ROWS, UPDATES = 8, 2  # rows per update, updates per object
N_CLASSES, N_LABELS, DIM, TOKENS, VOCAB, EXPERTS = 3, 3, 4, 3, 5, 4
VALUE_RTOL, VALUE_ATOL = 1e-5, 1e-7  # compute(): the two trees' maths may round differently
SKIP_REASONS = {
    "Metric": "abstract base class: no update of its own",
    "BaseAggregator": "abstract base class of the aggregators",
    "WrapperMetric": "abstract base class of the wrappers",
    "GlobalBatchLoss": "abstract base class of the global-batch losses",
    "FlatAccumulation": "a helper of GlobalMeanLoss (needs an owner loss and parameters), not a metric",
}
# classes built only around another metric: their cases are written out in _worker_cases (``pairs``)
_WRAPPED = {
    "BootStrapper",
    "ClasswiseWrapper",
    "MetricTracker",
    "MinMaxMetric",
    "MultitaskWrapper",
    "Running",
    "Synced",
}


# ================================================================================= worker: runs inside one tree
def _worker_cases() -> tuple[dict[str, Any], dict[str, str]]:
    """``(cases, skipped)``: label -> (build, data) for every object built in this tree; class name -> reason."""
    import importlib
    import inspect
    import zlib

    import torch
    from torch import nn

    import torchmetrics_diff as tmd

    def gen(label: str, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(zlib.crc32(f"{label}/{step}".encode()))

    def perm(g: torch.Generator, k: int, n: int = ROWS) -> torch.Tensor:  # every label present when n >= k
        return torch.randperm(n, generator=g) % k

    def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    def regression(g: torch.Generator) -> tuple:
        target = randn(g, ROWS)
        return target + 0.5 * randn(g, ROWS), target

    def binary(g: torch.Generator) -> tuple:
        return torch.sigmoid(randn(g, ROWS)), perm(g, 2)

    def multiclass(g: torch.Generator) -> tuple:
        return torch.softmax(randn(g, ROWS, N_CLASSES), 1), perm(g, N_CLASSES)

    def multilabel(g: torch.Generator) -> tuple:
        return torch.sigmoid(randn(g, ROWS, N_LABELS)), torch.stack([perm(g, 2) for _ in range(N_LABELS)], 1)

    def away_from_zero(g: torch.Generator) -> tuple:
        target = randn(g, ROWS).abs() + 1.0
        return target + 0.5 * randn(g, ROWS), target

    def values(g: torch.Generator) -> tuple:
        return (randn(g, ROWS),)

    def two_views(g: torch.Generator) -> tuple:
        return randn(g, ROWS, DIM), randn(g, ROWS, DIM)

    data = {
        "values": values,
        "weighted": lambda g: (randn(g, ROWS), torch.rand(ROWS, generator=g) + 0.5),
        "binary": binary,
        "multiclass": multiclass,
        "multilabel": multilabel,
        "regression": regression,
        "away_from_zero": away_from_zero,
        "vectors": two_views,
        "distributions": lambda g: (torch.softmax(randn(g, ROWS, DIM), 1), torch.softmax(randn(g, ROWS, DIM), 1)),
        "documents": lambda g: (randn(g, ROWS), perm(g, 2), perm(g, 3)),
        "pairs": lambda g: (lambda x: (x, x + 1.2 * randn(g, ROWS, DIM)))(randn(g, ROWS, DIM)),
        "tokens": lambda g: (randn(g, ROWS, TOKENS, VOCAB), torch.randint(0, VOCAB, (ROWS, TOKENS), generator=g)),
        "clip": lambda g: (*two_views(g), 10.0),
        "siglip": lambda g: (*two_views(g), 10.0, -10.0),
        "supcon": lambda g: (randn(g, ROWS, DIM), perm(g, 3)),
        "token_ce": lambda g: (randn(g, ROWS, VOCAB), torch.randint(0, VOCAB, (ROWS,), generator=g)),
        "router": lambda g: (
            torch.softmax(randn(g, ROWS, EXPERTS), 1),
            torch.randint(0, EXPERTS, (ROWS, 1), generator=g),
        ),
        "router_logits": lambda g: (randn(g, ROWS, EXPERTS),),
        "dino": lambda g: (randn(g, ROWS, DIM),),
        "multitask": lambda g: (lambda b, r: ({"cls": b[0], "reg": r[0]}, {"cls": b[1], "reg": r[1]}))(
            binary(g), regression(g)
        ),
    }

    # public classes of this tree
    classes: dict[str, type] = {}
    modules = [tmd] + [importlib.import_module(f"torchmetrics_diff.{m}") for m in SUBPACKAGES]
    for module in modules:
        names = getattr(module, "__all__", None)
        if names is None:  # aggregation, collections: their public classes
            names = [n for n, o in vars(module).items() if isinstance(o, type) and o.__module__ == module.__name__]
        for name in names:
            obj = getattr(module, name, None)
            if isinstance(obj, type) and not name.startswith("_"):
                classes[name] = obj

    explicit_data = {
        "SumMetric": "values",
        "MinMetric": "values",
        "MaxMetric": "values",
        "CatMetric": "values",
        "MeanMetric": "weighted",
        "CosineSimilarity": "vectors",
        "KLDivergence": "distributions",
        "MeanAbsolutePercentageError": "away_from_zero",
        "SymmetricMeanAbsolutePercentageError": "away_from_zero",
        "Perplexity": "tokens",
        "BarlowTwinsLoss": "vectors",
        "VICRegLoss": "vectors",
        "InfoNCELoss": "vectors",
        "CLIPLoss": "clip",
        "SigLIPLoss": "siglip",
        "SupConLoss": "supcon",
        "TokenCrossEntropyLoss": "token_ce",
        "GlobalMeanLoss": "values",
        "RouterZLoss": "router_logits",
        "RunningMean": "values",
        "RunningSum": "values",
    }
    explicit_kwargs = {"LoadBalancingLoss": ({"num_experts": EXPERTS}, "router"), "DINOCenter": ({"dim": DIM}, "dino")}
    tasks = {"Binary": ({}, "binary"), "Multiclass": ({"num_classes": N_CLASSES}, "multiclass")}
    tasks["Multilabel"] = ({"num_labels": N_LABELS}, "multilabel")
    regression_names = ("MeanSquaredError", "MeanAbsoluteError", "PearsonCorrCoef", "R2Score", "ExplainedVariance")

    def make(cls: type, **kwargs: Any) -> Any:
        return lambda: cls(**kwargs)

    cases: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name, cls in classes.items():
        if name in SKIP_REASONS:
            skipped[name] = SKIP_REASONS[name]
        elif name in explicit_data:
            cases[name] = (make(cls), data[explicit_data[name]])
        elif name in explicit_kwargs:
            kwargs, kind = explicit_kwargs[name]
            cases[name] = (make(cls, **kwargs), data[kind])
        elif name in regression_names or name == "SpearmanCorrCoef":
            cases[name] = (make(cls), data["regression"])
        elif any(name.startswith(p) for p in tasks):
            kwargs, kind = next(v for p, v in tasks.items() if name.startswith(p))
            cases[name] = (make(cls, **kwargs), data[kind])
        elif name.startswith("Retrieval"):
            cases[name] = (make(cls), data["documents"])
        elif name.startswith("CrossModal"):
            cases[name] = (make(cls), data["pairs"])
        elif issubclass(cls, nn.Module) and "task" in inspect.signature(cls.__init__).parameters:
            for prefix, (kwargs, kind) in tasks.items():
                cases[f"{name}[{prefix.lower()}]"] = (make(cls, task=prefix.lower(), **kwargs), data[kind])
        elif name not in ("MetricCollection", "CompositionalMetric", *classes.keys() & _WRAPPED):
            skipped[name] = "no generic inputs for it"

    # collections, composition, wrappers: around small metrics of this tree
    c = classes
    pairs = {
        "MetricCollection[MSE,MAE]": (
            lambda: c["MetricCollection"]([c["MeanSquaredError"](), c["MeanAbsoluteError"]()]),
            "regression",
        ),
        "MetricCollection[BinaryAccuracy,BinaryF1Score]": (
            lambda: c["MetricCollection"]({"acc": c["BinaryAccuracy"](), "f1": c["BinaryF1Score"]()}),
            "binary",
        ),
        "CompositionalMetric[MSE+MAE]": (lambda: c["MeanSquaredError"]() + c["MeanAbsoluteError"](), "regression"),
        "BootStrapper[MSE]": (
            lambda: c["BootStrapper"](c["MeanSquaredError"](), num_bootstraps=3, generator=0),
            "regression",
        ),
        "ClasswiseWrapper[MulticlassAccuracy]": (
            lambda: c["ClasswiseWrapper"](c["MulticlassAccuracy"](num_classes=N_CLASSES, average=None)),
            "multiclass",
        ),
        "MetricTracker[MSE]": (lambda: _tracked(c["MetricTracker"](c["MeanSquaredError"]())), "regression"),
        "MinMaxMetric[BinaryAccuracy]": (lambda: c["MinMaxMetric"](c["BinaryAccuracy"]()), "binary"),
        "MultitaskWrapper[BinaryAccuracy,MSE]": (
            lambda: c["MultitaskWrapper"]({"cls": c["BinaryAccuracy"](), "reg": c["MeanSquaredError"]()}),
            "multitask",
        ),
        "Running[SumMetric]": (lambda: c["Running"](c["SumMetric"](), window=3), "values"),
        "Synced[torchmetrics MSE]": (lambda: c["Synced"](_torchmetrics().regression.MeanSquaredError()), "regression"),
    }
    for label, (build, kind) in pairs.items():
        if label.split("[")[0] in classes:  # the wrapper, collection or composition class exists in this tree
            cases[label] = (build, data[kind])
    for name in classes.keys() & _WRAPPED:
        if not any(label.startswith(f"{name}[") for label in pairs):
            skipped[name] = "no case for this wrapper"
    return {label: (build, fn, gen) for label, (build, fn) in cases.items()}, skipped


def _tracked(tracker: Any) -> Any:
    tracker.increment()
    return tracker


def _torchmetrics() -> Any:
    import torchmetrics

    return torchmetrics


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A value (tensor, number, dict, list, tuple, nested) as leaves by key: tensors detached on the CPU, or reprs."""
    import torch

    if isinstance(value, dict):
        keys = {key: f"{prefix}.{key}" if prefix else str(key) for key in value}
        return {k: v for key, item in value.items() for k, v in _leaves(item, keys[key]).items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{prefix}[{i}]").items()}
    if isinstance(value, torch.Tensor):
        return {prefix: value.detach().cpu().clone()}
    if isinstance(value, (bool, int, float)):
        return {prefix: torch.tensor(value)}
    return {prefix: repr(value)}


def _states(obj: Any) -> dict[str, Any]:
    """Every state of ``obj`` and of its submodules: each metric's ``metric_state`` and each module's buffers."""
    out: dict[str, Any] = {}
    for prefix, module in obj.named_modules():
        own = dict(module.named_buffers(recurse=False))
        state = getattr(module, "metric_state", None)
        if isinstance(state, dict):
            own.update(state)
        out.update(_leaves(own, prefix))
    return out


def _diff(expected: dict, got: dict, exact: bool) -> list[str]:
    """What differs between two leaf dicts: keys, dtypes, shapes, values (exactly, or to float rounding)."""
    import torch

    problems = [f"missing {k}" for k in sorted(expected.keys() - got.keys())]
    problems += [f"extra {k}" for k in sorted(got.keys() - expected.keys())]
    for key in sorted(expected.keys() & got.keys()):
        a, b = expected[key], got[key]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if a != b:
                problems.append(f"{key}: {a!r} != {b!r}")
            continue
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{key}: {a.dtype} {tuple(a.shape)} != {b.dtype} {tuple(b.shape)}")
        elif a.is_floating_point() or a.is_complex():
            same = torch.equal(a, b) if exact else torch.allclose(a, b, VALUE_RTOL, VALUE_ATOL, equal_nan=True)
            if not same and not (exact and bool(((a == b) | (a.isnan() & b.isnan())).all())):
                problems.append(f"{key}: max |diff| {(a - b).abs().nan_to_num().max().item():.3g}")
        elif not torch.equal(a, b):
            problems.append(f"{key}: values differ")
    return problems


def _brief(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:240]


def _public_home(module: str) -> bool:
    """Whether ``module`` is a public module of the package: ``torchmetrics_diff`` and no ``_`` component."""
    parts = module.split(".")
    return parts[0] == "torchmetrics_diff" and not any(p.startswith("_") for p in parts)


def _public_names() -> dict[str, Any]:
    """``__all__`` of the package and of each public top-level submodule (else its names bound to package objects)."""
    import importlib
    import pkgutil

    import torchmetrics_diff as tmd

    out: dict[str, Any] = {"torchmetrics_diff": {"names": sorted(tmd.__all__), "all": True}}
    subs = {m.name for m in pkgutil.iter_modules(tmd.__path__) if not m.name.startswith("_")} | set(SUBPACKAGES)
    for sub in sorted(subs):
        name = f"torchmetrics_diff.{sub}"
        try:
            module = importlib.import_module(name)
        except Exception as error:  # an optional dependency missing: recorded, compared as such
            out[name] = {"error": f"import failed: {_brief(error)}"}
            continue
        if hasattr(module, "__all__"):
            out[name] = {"names": sorted(module.__all__), "all": True}
        else:  # no __all__: its public names bound to objects of the package's public modules (no private helpers)
            own = [
                n
                for n, o in vars(module).items()
                if not n.startswith("_")
                and not isinstance(o, type(tmd))
                and _public_home(str(getattr(o, "__module__", "")))
            ]
            attrs = sorted(n for n in vars(module) if not n.startswith("_"))  # a moved helper may stay importable
            out[name] = {"names": sorted(own), "all": False, "attrs": attrs}
    return out


def _save(io: Path) -> None:
    """Build, update, snapshot, pickle and state_dict every object; write the manifest and the public names."""
    import pickle

    import torch

    cases, skipped = _worker_cases()
    (io / "objects").mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"skipped": skipped, "objects": {}}
    reference: dict[str, Any] = {}
    for i, (label, (build, data, gen)) in enumerate(cases.items()):
        entry: dict[str, Any] = {"file": f"{i:03d}"}
        manifest["objects"][label] = entry
        stage = "build"
        try:
            torch.manual_seed(0)
            obj = build()
            stage = "update"
            for step in range(UPDATES):
                obj.update(*data(gen(label, step)))
            states = _states(obj)
            stage = "pickle"
            try:
                (io / "objects" / f"{i:03d}.pkl").write_bytes(pickle.dumps(obj))
            except Exception as error:
                entry["pickle_error"] = f"pickle.dumps: {_brief(error)}"
            stage = "state_dict"
            try:
                if hasattr(obj, "persistent"):
                    obj.persistent(True)
                sd = obj.state_dict()
                entry["state_dict_keys"] = len(sd)
                torch.save(sd, io / "objects" / f"{i:03d}.pt")
            except Exception as error:
                entry["state_dict_error"] = f"state_dict: {_brief(error)}"
            stage = "compute"
            value = _leaves(obj.compute()) if hasattr(obj, "compute") else {}
            reference[label] = {"states": states, "value": value}
        except Exception as error:
            entry["error"] = f"{stage}: {_brief(error)}"
    torch.save(reference, io / "reference.pt")
    (io / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (io / "names.json").write_text(json.dumps(_public_names(), indent=1))


def _check_one(obj: Any, ref: dict) -> list[str]:
    problems = [f"state {p}" for p in _diff(ref["states"], _states(obj), exact=True)]
    value = _leaves(obj.compute()) if hasattr(obj, "compute") else {}
    return problems + [f"compute {p}" for p in _diff(ref["value"], value, exact=False)]


def _load(io: Path, sources: dict[str, Path]) -> None:
    """Load every object each source tree saved (pickle, state_dict into a fresh object); write the outcomes."""
    import pickle

    import torch

    cases, _ = _worker_cases()
    results: dict[str, Any] = {}
    for side, src in sources.items():
        manifest = json.loads((src / "manifest.json").read_text())
        reference = torch.load(src / "reference.pt", weights_only=True)
        out: dict[str, Any] = {}
        for label, entry in manifest["objects"].items():
            if "error" in entry or label not in reference:
                continue
            ref = reference[label]
            got: dict[str, str] = {}
            if "pickle_error" in entry:
                got["pickle"] = f"n/a: {entry['pickle_error']}"
            else:
                try:
                    obj = pickle.loads((src / "objects" / f"{entry['file']}.pkl").read_bytes())
                    problems = _check_one(obj, ref)
                    got["pickle"] = "ok" if not problems else "; ".join(problems[:4])
                except Exception as error:
                    got["pickle"] = f"unpickle/compute: {_brief(error)}"
            if "state_dict_error" in entry:
                got["state_dict"] = f"n/a: {entry['state_dict_error']}"
            elif not entry.get("state_dict_keys"):
                got["state_dict"] = "n/a: state_dict holds nothing"
            elif label not in cases:
                got["state_dict"] = "no such object in this tree"
            else:
                try:
                    torch.manual_seed(0)
                    fresh = cases[label][0]()
                    if hasattr(fresh, "persistent"):
                        fresh.persistent(True)
                    fresh.load_state_dict(torch.load(src / "objects" / f"{entry['file']}.pt", weights_only=True))
                    problems = _check_one(fresh, ref)
                    got["state_dict"] = "ok" if not problems else "; ".join(problems[:4])
                except Exception as error:
                    got["state_dict"] = f"load/compute: {_brief(error)}"
            out[label] = got
        results[side] = out
    (io / "loaded.json").write_text(json.dumps(results, indent=1))


def _worker(args: argparse.Namespace) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    import torchmetrics_diff

    assert_imported_from(Path(args.tree), torchmetrics_diff.__file__)
    io = Path(args.io)
    if args.worker == "save":
        _save(io)
    else:
        _load(io, {side: Path(p) for side, p in zip(SIDES, args.sources)})
    print(json.dumps({"file": torchmetrics_diff.__file__}))


# ======================================================================================== driver: compares
def _classify(saved: dict[str, dict], loaded: dict[str, dict], check: str) -> tuple[dict, dict, dict]:
    """Objects checked per ``src->dst``; mismatches ``(label, direction) -> reason``; skips ``label -> reason``."""
    objects = {side: saved[side]["objects"] for side in SIDES}
    labels = sorted(objects["baseline"].keys() | objects["current"].keys())
    checked: dict[str, int] = {f"{s}->{d}": 0 for s in SIDES for d in SIDES}
    mismatches: dict[tuple[str, str], str] = {}
    skips: dict[str, str] = {}
    for label in labels:
        only = [s for s in SIDES if label not in objects[s]]
        if only:
            skips[label] = f"absent in {only[0]} (see public names)"
            continue
        errors = {s: objects[s][label].get("error") for s in SIDES}
        if all(errors.values()):
            skips[label] = f"cannot build/update in either tree: {errors['current']}"
            continue
        if any(errors.values()):
            bad = next(s for s in SIDES if errors[s])
            mismatches[(label, f"{bad} only")] = errors[bad]
            continue
        outcome = {(s, d): loaded[d][s][label][check] for s in SIDES for d in SIDES}
        na = {k: v for k, v in outcome.items() if v.startswith("n/a")}
        if len(na) == len(outcome):
            skips[label] = outcome[("current", "current")][5:]
            continue
        if na:  # e.g. pickles in one tree and not the other
            (src, _), reason = next(iter(na.items()))
            mismatches[(label, f"{src} only")] = reason[5:]
            continue
        if outcome[("baseline", "baseline")] != "ok" and outcome[("current", "current")] != "ok":
            skips[label] = f"fails within each tree: {outcome[('current', 'current')]}"
            continue
        for (src, dst), result in outcome.items():
            checked[f"{src}->{dst}"] += 1
            if result != "ok":
                mismatches[(label, f"{src}->{dst}")] = result
    return checked, mismatches, skips


def _names_cell(names: list[str], most: int = 4) -> str:
    """At most ``most`` names, then how many more (the notes under the table list them all)."""
    more = f" +{len(names) - most} more" if len(names) > most else ""
    return (", ".join(names[:most]) + more) or "-"


def _names_table(names: dict[str, dict]) -> tuple[str, int]:
    from _timing import table

    def count(entry: dict | None) -> str:
        if entry is None:
            return "absent"
        return "import failed" if "error" in entry else f"{len(entry['names'])}{'' if entry['all'] else '*'}"

    rows, bad, notes = [], 0, []
    for module in sorted(names["baseline"].keys() | names["current"].keys()):
        a, b = names["baseline"].get(module), names["current"].get(module)
        old, new = set((a or {}).get("names", ())), set((b or {}).get("names", ()))
        # without __all__, a name still (or already) bound in the module is neither added nor removed
        added = sorted(new - old - set((a or {}).get("attrs", ())))
        removed = sorted(old - new - set((b or {}).get("attrs", ())))
        errors = {side: e["error"] for side, e in (("baseline", a), ("current", b)) if e and "error" in e}
        # names may be added (a new public name breaks nobody); a removed name, or a module gone, is a break
        same = not removed and a is not None and b is not None and (a.get("error") == b.get("error"))
        rows.append([module, count(a), count(b), _names_cell(added), _names_cell(removed)])
        notes += [f"{module}: added {', '.join(added)}"] if added else []
        notes += [f"{module}: removed {', '.join(removed)}"] if removed else []
        notes += [f"{module}: {side}: {error}" for side, error in errors.items()]
        bad += not same
    notes.append(
        "* no __all__: its public names bound to objects of the package's public modules (a name the other tree "
        "still binds there, e.g. a helper moved to a private module, counts as neither added nor removed)"
    )
    headers = ["module", "baseline names", "current names", "added", "removed"]
    return table(f"Public names: {bad} module(s) lost a name", headers, rows, notes), bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"git revision (default {DEFAULT_BASELINE})")
    parser.add_argument("--worker", choices=("save", "load"), help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--io", help=argparse.SUPPRESS)
    parser.add_argument("--sources", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return 0

    start = time.perf_counter()
    base_hash = _short_hash(args.baseline)
    script = str(Path(__file__).resolve())
    with baseline_worktree(base_hash, prefix="check_compat_") as (tmp, base_tree):
        trees = {"baseline": base_tree, "current": REPO}
        io = {side: tmp / f"io_{side}" for side in SIDES}
        for step in ("save", "load"):  # save in each tree, then load both trees' files in each
            for side in SIDES:
                argv = [script, "--worker", step, "--tree", str(trees[side]), "--io", str(io[side])]
                argv += ["--sources", *(str(io[s]) for s in SIDES)] if step == "load" else []
                proc = run_in_tree(trees[side], argv)
                assert_imported_from(trees[side], json.loads(proc.stdout.strip().splitlines()[-1])["file"])
        saved = {s: json.loads((io[s] / "manifest.json").read_text()) for s in SIDES}
        loaded = {s: json.loads((io[s] / "loaded.json").read_text()) for s in SIDES}
        names = {s: json.loads((io[s] / "names.json").read_text()) for s in SIDES}

    from _timing import table  # only here: it puts the repository first on sys.path, which a worker must not

    failed = 0
    dirty = " + uncommitted changes to torchmetrics_diff/" if package_dirty() else ""
    print(f"baseline {base_hash} (--baseline {args.baseline}) vs current (HEAD{dirty})\n")
    for check in CHECKS:
        checked, mismatches, skips = _classify(saved, loaded, check)
        rows = []
        for direction, n in checked.items():
            bad = sorted(label for label, d in mismatches if d == direction)
            rows.append([direction.replace("->", " -> "), n, len(bad), _names_cell(bad)])
        for side in SIDES:  # built or saved in one tree only (e.g. pickles in one tree, not the other)
            bad = sorted(label for label, d in mismatches if d == f"{side} only")
            if bad:
                rows.append([f"fails in {side} only", "", len(bad), _names_cell(bad)])
        notes = [f"mismatch {label} ({d}): {reason}" for (label, d), reason in sorted(mismatches.items())]
        notes += [f"skipped {label}: {reason}" for label, reason in sorted(skips.items())]
        title = f"{check}: {len(mismatches)} mismatch(es), {len(skips)} skipped"
        print(table(title, ["direction", "objects checked", "mismatches", "names"], rows, notes))
        failed += len(mismatches)
    skipped_classes = {**saved["baseline"]["skipped"], **saved["current"]["skipped"]}
    print("classes not built (both checks):")
    for name, reason in sorted(skipped_classes.items()):
        print(f"  {name}: {reason}")
    print()
    text, bad_modules = _names_table(names)
    print(text)
    failed += bad_modules
    print(f"{'FAIL' if failed else 'OK'}: {failed} mismatch(es); {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
