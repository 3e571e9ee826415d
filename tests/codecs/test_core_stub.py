"""The type stub of the compiled core (``cqforensics_core.pyi``, beside the built module) against
the module itself: the stub names exactly the module's public names, each function with the
parameters (names, order, which have defaults) the module reports in ``__text_signature__``,
and each class with exactly its attributes. Without a built core this skips (CQF_NO_SKIP=1
makes that a failure)."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from cqforensics import compiled as core
from support import ROOT, skip_or_fail

STUB = ROOT / "cqforensics_core.pyi"


@pytest.fixture(scope="module")
def module():
    try:
        mod = importlib.import_module("cqforensics_core")
    except ImportError as e:
        skip_or_fail(f"the compiled core is not built: {e}")
    if getattr(mod, "ABI", None) != core.ABI:
        skip_or_fail(f"the compiled core is a stale build (ABI {getattr(mod, 'ABI', '?')}, sources {core.ABI})")
    return mod


def _stub() -> dict[str, ast.stmt]:
    """The stub's top-level definitions by name."""
    out = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stub_names_exactly_the_modules_public_names(module):
    assert set(_stub()) == _public(module)


def test_stub_gives_each_function_the_modules_parameters(module):
    checked = 0
    for name, node in _stub().items():
        if not isinstance(node, ast.FunctionDef):
            continue
        assert callable(getattr(module, name)), f"{name}: a function in the stub, not in the module"
        params = inspect.signature(getattr(module, name)).parameters.values()  # from __text_signature__
        args = node.args
        assert not (args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs), name
        with_default = {a.arg for a in args.args[len(args.args) - len(args.defaults) :]}
        assert [a.arg for a in args.args] == [p.name for p in params], name
        assert with_default == {p.name for p in params if p.default is not inspect.Parameter.empty}, name
        checked += 1
    assert checked == len([n for n in _public(module) if inspect.isbuiltin(getattr(module, n))])


def test_stub_gives_each_class_its_attributes(module):
    for name, node in _stub().items():
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, name)
        assert isinstance(cls, type), f"{name}: a class in the stub, not in the module"
        stubbed = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
        assert stubbed == _public(cls), name


def test_stub_is_named_where_the_module_is_built_and_shipped():
    """Beside the built module (a checkout's build, ``/work/bin/wt-build`` or ``pip install -e``),
    and listed for the wheel (pyproject.toml), where type checkers look for it."""
    assert STUB.is_file()
    assert "cqforensics_core.pyi" in (ROOT / "pyproject.toml").read_text()


def test_a_debug_build_says_so(module, monkeypatch):
    """A debug build (setuptools-rust's default for an editable install, before ``debug = false``)
    answers the same, about 10x slower: ``--version`` and every provenance record say which."""
    assert isinstance(module.DEBUG, bool)
    assert core.debug_build() == module.DEBUG and ("debug build" in core.status()) == module.DEBUG
    monkeypatch.setattr(module, "DEBUG", True, raising=False)
    monkeypatch.setattr(core, "_native", module)
    assert core.debug_build() and "debug build" in core.status()
