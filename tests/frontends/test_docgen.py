"""Shell completion and the man page are generated from the argparse definitions: every
subcommand and every option appears, the scripts parse, and bash completes from them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cli import docgen
from cli.main import build_parser
from support import skip_or_fail
from support.cli import run


def _everything():
    parser = build_parser()
    subs = docgen._subparsers(parser)
    return parser, subs, {name: docgen._words(sp) for name, sp in subs.items()}


@pytest.mark.parametrize("kind", ["bash", "zsh", "man"])
def test_every_subcommand_and_option_appears(kind, capsys):
    parser, subs, words = _everything()
    assert {"fsck", "compact", "verify", "export", "read", "completion", "manpage"} <= set(subs)
    code, text, _ = run(capsys, *(["manpage"] if kind == "man" else ["completion", kind]))
    assert code == 0
    if kind == "man":
        text = text.replace("\\-", "-")
    for name, opts in words.items():
        assert name in text, name
        for o in opts:
            assert o in text, (name, o)
    for o in docgen._words(parser):
        assert o in text, o
    if kind == "man":
        for name, sp in subs.items():
            assert f".SS {name}\n" in text
            for a in docgen._positionals(sp):
                assert (a.metavar or a.dest) in text


def test_bash_script_parses_and_completes(capsys, tmp_path):
    if shutil.which("bash") is None:
        skip_or_fail("bash is not installed")
    code, script, _ = run(capsys, "completion", "bash")
    (tmp_path / "c.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "c.sh")]).returncode == 0

    def complete(*words: str) -> list[str]:
        line = " ".join(["cqforensics", *words])
        probe = (
            f"source {tmp_path / 'c.sh'}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
            "_cqforensics; printf '%s\\n' \"${COMPREPLY[@]}\""
        )
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path).stdout.split()

    assert "compact" in complete("comp") and "completion" in complete("comp")
    assert complete("compact", "--thr") == ["--threshold"]
    assert set(complete("export", "--format", "")) == {"jsonl", "parquet"}
    assert "--allow-garbage" in complete("verify", "--")


def test_zsh_script_parses(capsys, tmp_path):
    if shutil.which("zsh") is None:
        skip_or_fail("zsh is not installed (apt-get install zsh; .ci/run installs it)")
    code, script, _ = run(capsys, "completion", "zsh")
    (tmp_path / "_cqforensics").write_text(script)
    assert subprocess.run(["zsh", "-n", str(tmp_path / "_cqforensics")]).returncode == 0


def test_man_page_renders(capsys, tmp_path):
    code, page, _ = run(capsys, "manpage")
    assert page.startswith(".TH CQFORENSICS 1 ")
    if shutil.which("groff") is None:
        skip_or_fail("groff is not installed (apt-get install groff; .ci/run installs it)")
    (tmp_path / "cqforensics.1").write_text(page)
    p = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", str(tmp_path / "cqforensics.1")], capture_output=True, text=True
    )
    assert p.returncode == 0 and "compact" in p.stdout and not p.stderr.strip(), p.stderr[:500]


def test_command_reference_page_is_current():
    """docs/reference/cli.md is generated from the parser (``python3 -m cli.docgen >
    docs/reference/cli.md``): a command or option changed without regenerating it fails here."""
    from support import ROOT

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert page == docgen.markdown(build_parser()), "regenerate it: python3 -m cli.docgen > docs/reference/cli.md"
    for name in docgen._subparsers(build_parser()):
        assert f"\n## {name}\n" in page, name
