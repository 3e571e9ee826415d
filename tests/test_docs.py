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
