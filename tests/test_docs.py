"""README.md documents every table, every Spark option, every finding code and every command."""

import re

import cqforensics
from conftest import ROOT

README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    m = re.search(rf"^#+ {re.escape(title)}.*?$(.*?)(?=^## )", README, re.M | re.S)
    assert m, f"README has no section {title!r}"
    return m.group(1)


def test_readme_starts_with_the_two_commands():
    first = README.split("```sh", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(first) == 2
    assert first[0].startswith("python3 -m pip install . && cqforensics ")
    assert first[1] == "python3 -m pip install '.[test]' && python3 -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert first[1] in ci


def test_every_table_is_documented():
    for t in cqforensics.TABLES:
        assert f"| `{t}` |" in README


def test_every_spark_option_is_documented():
    from spark_datasource.options import OPTIONS

    table = section("Spark")
    documented = {m.lower() for m in re.findall(r"^\| `(\w+)` \|", table, re.M)}
    assert documented == set(OPTIONS)


def test_every_spark_write_option_is_documented():
    from spark_datasource.writer import WRITE_OPTIONS

    table = section("Spark writer")
    documented = {m.lower() for m in re.findall(r"^\| `(\w+)` \|", table, re.M)}
    assert documented == set(WRITE_OPTIONS)


def test_every_lost_found_reason_is_documented():
    from cqforensics.write.salvage import QUARANTINED

    text = section("`cqforensics rebuild")
    for reason in QUARANTINED | {"undecodable", "torn_write", "orphan", "duplicate"}:
        assert f"`{reason}`" in text, reason


def test_every_finding_code_is_documented():
    from cqforensics.findings import CODES

    table = section("Finding codes")
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert sorted(documented) == sorted(CODES)


def test_every_command_is_documented():
    from cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in sub.choices:
        assert f"### `cqforensics {name}" in README, name


def test_exit_codes_are_documented():
    from cli import exitcodes

    table = section("Exit codes")
    for code in (exitcodes.OK, exitcodes.FIXED, exitcodes.ERRORS_LEFT, exitcodes.OPERATIONAL, exitcodes.USAGE,
                 exitcodes.INTERRUPTED):
        assert f"| {code} |" in table


def test_every_drop_reason_is_documented():
    from cqforensics.scan import FATES

    for reason in FATES[1:]:
        assert f"`{reason}`" in README, reason
