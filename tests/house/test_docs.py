"""The docs (README.md and the pages of the docs site, docs/*.md) document every table, every
Spark option, every finding code and every command, and the README's first command works with
what pip installs."""

import os
import re
import shutil
import subprocess
import sys

import cqforensics
from support import ROOT, SAMPLES

README = (ROOT / "README.md").read_text()
#: the manual: the README and the pages of the docs site beside it (docs/formats and
#: docs/reference are specifications and generated pages, not where these tables live)
PAGES = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
DOCS = "\n".join(PAGES.values())


def section(title: str) -> str:
    """The text under the one heading of the docs that starts with ``title``, up to the next
    heading of the same or a higher level (or the end of its page)."""
    found = []
    for text in PAGES.values():
        for m in re.finditer(rf"^(#+) {re.escape(title)}.*?$", text, re.M):
            end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", re.M).search(text, m.end())
            found.append(text[m.end() : end.start() if end else len(text)])
    assert len(found) == 1, f"the docs have {len(found)} sections {title!r}, not one"
    return found[0]


def test_readme_starts_with_the_two_commands():
    first = README.split("```sh", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(first) == 2
    assert first[0].startswith("python3 -m pip install . && cqforensics ")
    assert first[1] == "python3 -m pip install '.[test]' && python3 -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert first[1] in ci


def test_the_installed_tool_runs_outside_the_checkout(tmp_path):
    """The README's first command: what pip installed (not this checkout, which the other tests
    import) holds every module, and its console script runs fsck on a sample."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for top in ("cqforensics", "cli", "spark_datasource", "pyspark_rabbitcq")
        for p in (ROOT / top).rglob("*.py")
        if p.name != "__main__.py" and "broker" not in p.relative_to(ROOT / top).parts[:1]
    )  # the harness is not shipped
    load = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    p = subprocess.run([sys.executable, "-c", load, *modules], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, f"install the project first (python3 -m pip install '.[test]'): {p.stderr[-1500:]}"
    exe = shutil.which("cqforensics", path=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]))
    assert exe, "pip installed no cqforensics console script"
    p = subprocess.run(
        [exe, "fsck", str(SAMPLES / "4.3.6-kill")], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert p.returncode in (0, 4) and "Traceback" not in p.stderr, p.stderr[-1500:]
    assert "4.3.6-kill" in p.stdout or "rabbit@localhost" in p.stdout


def test_every_table_is_documented():
    for t in cqforensics.TABLES:
        assert f"| `{t}` |" in section("Tables"), t


def test_every_spark_option_is_documented():
    from spark_datasource.options import OPTIONS

    table = section("Spark:")
    documented = {m.lower() for m in re.findall(r"^\| `(\w+)` \|", table, re.M)}
    assert documented == set(OPTIONS)


def test_every_spark_write_option_is_documented():
    from spark_datasource.writer import WRITE_OPTIONS

    table = section("Spark writer")
    documented = {m.lower() for m in re.findall(r"^\| `(\w+)` \|", table, re.M)}
    assert documented == set(WRITE_OPTIONS)


def test_every_lost_found_reason_is_documented():
    from cqforensics.model.recovery import QUARANTINED

    text = section("`cqforensics rebuild")
    from cqforensics.write.formats import NOT_REPRESENTABLE

    for reason in {f.label for f in QUARANTINED} | {
        "undecodable",
        "torn_write",
        "orphan",
        "duplicate",
        NOT_REPRESENTABLE,
    }:
        assert f"`{reason}`" in text, reason


def test_every_finding_code_is_documented():
    from cqforensics.base.findings import CODES

    table = section("Finding codes")
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert sorted(documented) == sorted(CODES)


def test_every_command_is_documented():
    from cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in sub.choices:
        assert re.search(rf"^#+ `cqforensics {re.escape(name)}[ `]", DOCS, re.M), name


def test_exit_codes_are_documented():
    from cli import exitcodes

    table = section("Exit codes")
    for code in (
        exitcodes.OK,
        exitcodes.FIXED,
        exitcodes.ERRORS_LEFT,
        exitcodes.OPERATIONAL,
        exitcodes.USAGE,
        exitcodes.INTERRUPTED,
    ):
        assert f"| {code} |" in table


def test_every_drop_reason_is_documented():
    from cqforensics.base.enums import FATE_LABELS

    for reason in FATE_LABELS[1:]:
        assert f"`{reason}`" in section("Tables"), reason
