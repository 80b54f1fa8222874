"""Serve every torchmetrics metric class to torchmetrics' own unit tests as ``Synced(real class)``.

Active only when ``TM_SYNCED=1``. Loaded by pytest with ``-p synced_plugin`` and, in every other Python process
started with this folder on PYTHONPATH (the spawned DDP pool workers), by ``sitecustomize``.

How: ``builtins.__import__`` is wrapped. When a module of the test tree (``unittests`` or ``unittests.*``) imports a
torchmetrics module (``torchmetrics`` or ``torchmetrics.*``, except ``torchmetrics.functional*`` and
``torchmetrics.utilities*``), it receives a proxy of that module (attribute writes go through to the real module)
whose metric classes (subclasses of ``torchmetrics.Metric`` other than ``Metric`` itself) are stand-ins, and whose
submodules are proxies too. torchmetrics' own modules are never modified (so torchmetrics' internals, and pickling
of the real classes by reference, are untouched), and the functional API is served as it is.

A stand-in looks like the class (``__name__``, ``__qualname__``, ``__module__``, ``__doc__``, every class attribute
through its metaclass, ``isinstance``/``issubclass`` against it), but calling it returns
``torchmetrics_diff.wrappers.Synced(real_class, *args, **kwargs)``. Stand-ins pickle as "the stand-in of <real
class>" (copyreg), so a worker unpickles them into its own stand-ins.

One check is neutralised and recorded instead of failing: torchmetrics' testers call ``torch.jit.script(metric)``
first in every class test, and torchmetrics_diff refuses TorchScript by design (see ``_install_script_guard``).
"""

from __future__ import annotations

import builtins
import copyreg
import json
import os
import sys
import types

ACTIVE = os.environ.get("TM_SYNCED", "0") == "1"
_LOG = os.environ.get("TM_SYNCED_LOG", "")  # a JSON-lines file of what the plugin did (none: nothing kept)

_orig_import = builtins.__import__
_STANDINS: dict = {}
_PROXIES: dict = {}
_tm = None


def _torchmetrics():
    global _tm
    if _tm is None:
        import torchmetrics

        _tm = torchmetrics
    return _tm


def _log(event: dict) -> None:
    if not _LOG:
        return
    try:
        event["pid"] = os.getpid()
        with open(_LOG, "a") as f:
            f.write(json.dumps(event) + "\n")
    except Exception:
        pass


class _StandInMeta(type):
    """Metaclass of the stand-ins: calling one builds Synced(real, ...); the rest is the real class's.

    A class statement in test code that subclasses a stand-in (``class Tester(TotalVariation): ...``) makes a real
    subclass of the real torchmetrics class, and binds the stand-in of that subclass (so the test's own override is
    what Synced adapts). The real subclass is kept in its module under ``_tm_real_<name>`` (its ``__qualname__``), so
    that pickle finds it by reference in this process and in the workers.
    """

    def __new__(mcls, name, bases, ns, **kwargs):
        if any(isinstance(b, _StandInMeta) for b in bases):
            real_bases = tuple(b._tm_real if isinstance(b, _StandInMeta) else b for b in bases)
            meta = type(real_bases[0])
            for b in real_bases[1:]:
                if issubclass(type(b), meta):
                    meta = type(b)
            cell = ns.get("__classcell__")
            body = {k: v for k, v in ns.items() if k != "__classcell__"}
            real_sub = meta(name, real_bases, body, **kwargs)
            if cell is not None:  # zero-argument super() in the body's methods: point it at the real subclass
                new_cell = types.CellType(real_sub)
                for key, value in list(real_sub.__dict__.items()):
                    rebound = _rebind(value, cell, new_cell)
                    if rebound is not value:
                        setattr(real_sub, key, rebound)
            qual = ns.get("__qualname__", name)
            if "<locals>" not in qual:
                hidden = f"_tm_real_{qual.replace('.', '_')}"
                real_sub.__qualname__ = hidden
                module = sys.modules.get(real_sub.__module__)
                if module is not None:
                    setattr(module, hidden, real_sub)
            _log({"event": "subclassed", "class": name, "module": real_sub.__module__})
            standin = _standin_for(real_sub)
            if cell is not None:
                cell.cell_contents = standin  # (what the class statement checks it binds)
            return standin
        return super().__new__(mcls, name, bases, ns)

    def __init__(cls, *args, **kwargs):
        pass

    def __call__(cls, *args, **kwargs):
        from torchmetrics_diff.wrappers import Synced

        _install_script_guard()
        real = cls._tm_real
        try:
            return Synced(real, *args, **kwargs)
        except TypeError as err:
            if "Synced cannot adapt" in str(err):
                _log({"event": "refused", "class": real.__qualname__, "msg": str(err)[:500]})
            raise

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(cls._tm_real, name)

    def __instancecheck__(cls, obj):
        from torchmetrics_diff.wrappers import Synced

        real = cls._tm_real
        return isinstance(obj, real) or (isinstance(obj, Synced) and isinstance(obj._modules.get("metric"), real))

    def __subclasscheck__(cls, sub):
        from torchmetrics_diff.wrappers import synced as _synced

        real = cls._tm_real
        if sub is cls or (isinstance(sub, type) and issubclass(sub, real)):
            return True
        return any(adapted is sub and issubclass(inner, real) for inner, adapted in _synced._CLASSES.items())

    def __repr__(cls):
        return f"<stand-in Synced({cls._tm_real.__module__}.{cls._tm_real.__qualname__})>"


_SCRIPT_GUARD = {"installed": False}


def _install_script_guard() -> None:
    """torchmetrics' testers call ``torch.jit.script(metric)`` first thing in every class test; torchmetrics_diff
    refuses TorchScript by design (``TypeError: torch.jit.script does not support ...``). That refusal is recorded
    (event ``jit_script_refused``) and the rest of the test goes on, so that it does not mask every later check.
    Anything else (another error, or a successful script) is what torch.jit.script does."""
    if _SCRIPT_GUARD["installed"]:
        return
    import torch.jit

    original = torch.jit.script

    def script(obj, *args, **kwargs):
        from torchmetrics_diff.wrappers import Synced

        if isinstance(obj, Synced):
            try:
                return original(obj, *args, **kwargs)
            except TypeError as err:
                if "torch.jit.script does not support" not in str(err):
                    raise
                _log(
                    {
                        "event": "jit_script_refused",
                        "class": type(obj._modules["metric"]).__qualname__,
                        "test": os.environ.get("PYTEST_CURRENT_TEST"),
                        "msg": str(err)[:300],
                    }
                )
                return obj
        return original(obj, *args, **kwargs)

    script._tm_original = original
    torch.jit.script = script
    _SCRIPT_GUARD["installed"] = True


def _rebind(value, old_cell, new_cell):
    """``value`` (a function, or a static/class method or property of one) with ``old_cell`` in its closure
    replaced by ``new_cell``; ``value`` itself when it has none."""
    if isinstance(value, types.FunctionType):
        if not value.__closure__ or not any(c is old_cell for c in value.__closure__):
            return value
        fn = types.FunctionType(
            value.__code__,
            value.__globals__,
            value.__name__,
            value.__defaults__,
            tuple(new_cell if c is old_cell else c for c in value.__closure__),
        )
        fn.__kwdefaults__ = value.__kwdefaults__
        fn.__dict__.update(value.__dict__)
        fn.__qualname__, fn.__doc__, fn.__module__ = value.__qualname__, value.__doc__, value.__module__
        fn.__annotations__ = value.__annotations__
        return fn
    if isinstance(value, (staticmethod, classmethod)):
        inner = _rebind(value.__func__, old_cell, new_cell)
        return value if inner is value.__func__ else type(value)(inner)
    if isinstance(value, property):
        parts = [
            _rebind(f, old_cell, new_cell) if f is not None else None for f in (value.fget, value.fset, value.fdel)
        ]
        if all(a is b for a, b in zip(parts, (value.fget, value.fset, value.fdel))):
            return value
        return property(*parts, value.__doc__)
    return value


def _standin_for(real: type) -> type:
    standin = _STANDINS.get(real)
    if standin is None:
        attrs = {
            "_tm_real": real,
            "__module__": real.__module__,
            "__qualname__": real.__qualname__,
            "__doc__": real.__doc__,
        }
        from torchmetrics_diff.metric import _CONSTANTS  # the class-level facts torchmetrics' metrics declare

        for name in sorted(_CONSTANTS):
            if hasattr(real, name):
                attrs[name] = getattr(real, name)
        standin = _StandInMeta(real.__name__, (object,), attrs)
        _STANDINS[real] = standin
    return standin


def _reduce_standin(standin: type):
    return (_standin_for, (standin._tm_real,))


copyreg.pickle(_StandInMeta, _reduce_standin)


def _is_served_module(name: str) -> bool:
    if name != "torchmetrics" and not name.startswith("torchmetrics."):
        return False
    return not name.startswith(("torchmetrics.functional", "torchmetrics.utilities"))


def _serve(obj):
    if isinstance(obj, types.ModuleType):
        return _proxy(obj) if _is_served_module(obj.__name__) else obj
    if isinstance(obj, type) and not isinstance(obj, _StandInMeta):
        tm = _torchmetrics()
        mod = getattr(obj, "__module__", "") or ""
        if (
            issubclass(obj, tm.Metric)
            and obj is not tm.Metric
            and (mod == "torchmetrics" or mod.startswith("torchmetrics."))
        ):
            return _standin_for(obj)
    return obj


class _ProxyModule(types.ModuleType):
    def __init__(self, real: types.ModuleType) -> None:
        super().__init__(real.__name__, real.__doc__)
        d = self.__dict__
        d["_tm_real_module"] = real
        for key in ("__file__", "__path__", "__package__", "__spec__", "__loader__", "__all__", "__version__"):
            if hasattr(real, key):
                d[key] = getattr(real, key)

    def __getattr__(self, name):
        return _serve(getattr(self.__dict__["_tm_real_module"], name))

    def __setattr__(self, name, value):  # a test that patches a module patches torchmetrics' real one
        setattr(self.__dict__["_tm_real_module"], name, value)

    def __delattr__(self, name):
        delattr(self.__dict__["_tm_real_module"], name)

    def __dir__(self):
        return dir(self.__dict__["_tm_real_module"])

    def __repr__(self):
        return f"<proxy of {self.__dict__['_tm_real_module']!r}>"


def _proxy(mod: types.ModuleType) -> types.ModuleType:
    p = _PROXIES.get(mod.__name__)
    if p is None or p.__dict__["_tm_real_module"] is not mod:
        p = _PROXIES[mod.__name__] = _ProxyModule(mod)
    return p


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    mod = _orig_import(name, globals, locals, fromlist, level)
    if level != 0 or not globals:
        return mod
    importer = globals.get("__name__") or ""
    if importer != "unittests" and not importer.startswith("unittests."):
        return mod
    if not _is_served_module(name):
        return mod
    return _proxy(mod)


def install() -> None:
    if builtins.__import__ is not _import:
        builtins.__import__ = _import


if ACTIVE:
    install()


# ---- pytest side (only when loaded by pytest with -p synced_plugin)
def pytest_report_header(config):
    return f"synced_plugin: TM_SYNCED={'1 (metric classes served as Synced)' if ACTIVE else '0 (real classes)'}"
