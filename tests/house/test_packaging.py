"""pyspark (and pandas) are the `spark` extra: `pip install .` gives a CLI that runs without them
(the README's first command), and the Spark data source names the extra when pyspark is missing."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from support import ROOT, SAMPLES

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pyspark', 'pandas'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_spark_is_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("<")[0].split("=")[0].strip() for d in project["dependencies"]]
    assert "pyspark" not in names and "pandas" not in names and "pyarrow" in names
    extras = project["optional-dependencies"]
    assert any(d.startswith("pyspark") for d in extras["spark"])
    assert "cqforensics[spark]" in extras["test"]


def test_readme_first_command_runs_without_pyspark_and_pandas():
    first = (ROOT / "README.md").read_text().split("```sh\n", 1)[1].splitlines()[0]
    assert first == "python3 -m pip install . && cqforensics fsck sample_data/4.3.6-kill"
    p = _run(f"""
from cli.main import main
code = main(['fsck', {str(SAMPLES / "4.3.6-kill")!r}])
assert 'pyspark' not in sys.modules and 'pandas' not in sys.modules, 'imported'
sys.exit(code)
""")
    assert p.returncode == 0, p.stderr
    assert "predicted" in p.stdout or "queue" in p.stdout


def test_spark_data_source_names_the_extra_when_pyspark_is_missing():
    for module in ("spark_datasource", "pyspark_rabbitcq"):
        p = _run(f"import {module}")
        assert p.returncode == 1
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("ModuleNotFoundError: the rabbitcq Spark data source needs pyspark")
        assert "pip install 'cqforensics[spark]'" in last


def test_the_broker_harness_is_not_in_the_wheel_and_extras_are_pinned():
    """The packages the wheel takes (setuptools' find with pyproject's include and exclude): the
    real-broker harness is the tests' and benchmarks' (run from the checkout), not the tool's;
    every runtime and extra dependency the tool uses has an upper bound (the newest tested)."""
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = config["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(ROOT, include=find["include"], exclude=find["exclude"])
    assert "cqforensics" in packages and "cqforensics.readers" in packages and "cli" in packages
    assert not [p for p in packages if p.startswith("brokers")]
    project = config["project"]
    for dep in (
        project["dependencies"]
        + project["optional-dependencies"]["spark"]
        + project["optional-dependencies"]["streams"]
    ):
        assert "<" in dep, f"{dep}: no upper bound"
