"""The layers of docs/architecture.md, checked by import-linter (contracts in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess

from support import ROOT


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is a test dependency: python3 -m pip install '.[test]'"
    p = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "BROKEN" not in p.stdout


def test_no_module_above_the_readers_does_framing_arithmetic():
    """Body framing (entry headers, markers) is the readers' business: ``term_span``/``entry_span``."""
    import re

    offenders = []
    for path in (ROOT / "cqforensics").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(
            (
                "cqforensics/readers/",
                "cqforensics/grammar/",
                "cqforensics/write/formats.py",
                "cqforensics/write/store.py",
                "cqforensics/broker/",
            )
        ):
            continue
        text = path.read_text()
        for pat in (r"\+ ?24\b", r"- ?25\b", r"ENTRY_HEADER_SIZE \+", r"\+ ENTRY_HEADER_SIZE"):
            for m in re.finditer(pat, text):
                line = text[: m.start()].count("\n") + 1
                before = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
                if before.count('"') % 2 or before.lstrip().startswith("#"):
                    continue  # inside a string or a comment
                offenders.append(f"{rel}:{line}: {text.splitlines()[line - 1].strip()}")
    assert not offenders, "\n".join(offenders)


def test_no_module_outside_the_model_maps_files():
    """``model.bodies.Bodies`` is the one holder of memory maps of input files above the readers
    (``cqforensics/base/parallel.py`` maps only the memfd a worker hands its batches over in)."""
    offenders = []
    for path in (ROOT / "cqforensics").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("cqforensics/readers/", "cqforensics/model/bodies.py", "cqforensics/base/parallel.py")):
            continue
        if "map_file(" in path.read_text() or "mmap.mmap(" in path.read_text():
            offenders.append(rel)
    assert not offenders, offenders
