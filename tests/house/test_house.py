"""The house checks CI runs with the suite: ruff's lint rules (pyproject.toml [tool.ruff.lint]:
pyflakes, pycodestyle, bugbear, pyupgrade, import order) and its formatter, on the whole Python
tree. Three merges of parallel work here each left a name shadowed or unbound that only such a
check sees before a user does. Skips with a reason without ruff (CQF_NO_SKIP=1 makes that a
failure: .ci/run). The Rust core's rustfmt and clippy run in .ci/run itself (they need cargo)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import ROOT, skip_or_fail


def _ruff(*args: str) -> subprocess.CompletedProcess:
    try:
        import ruff  # noqa: F401
    except ImportError:
        skip_or_fail("ruff is not installed (the test extra has it)")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("check", [("check",), ("format", "--check")], ids=["lint", "format"])
def test_ruff_finds_nothing(check):
    p = _ruff(*check)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-1000:]
