"""Every command shown in the docs runs: each line starting with ``cqforensics `` in a ```sh block
of README.md or docs/*.md (not docs/formats, byte-level specifications, nor docs/reference,
generated from the parser) is run as shown, page by page in the order the page shows them, from
the checkout (``python -m cli.main``). The examples name the sample node dirs (``sample_data/``);
what they write goes into the test's tmp dir: a run's working dir is that dir (so a relative
``--out X``, ``--html X`` or ``> X`` lands there), ``/tmp/`` becomes it and ``~`` a home inside
it. A page's ``cp``/``chmod``/``mkdir`` lines (the runbook copies the sample first) run too, in
their place. Each command must end without a traceback and with an exit code below 8 (an answer:
0 clean, 1 repaired, 2/4/6 what fsck found), the setup lines with 0. The commands that need a
live broker are in SKIPPED, each with its reason; a SKIPPED line the docs no longer show fails,
so the list cannot go stale."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP = ("cp ", "chmod ", "mkdir ")

#: shown on purpose, not run here: they send to a live broker (tests/commands/test_republish.py replays the
#: samples into real 3.10.8 and 4.3.6 brokers, journal and kills included)
SKIPPED = {
    "cqforensics republish broken/rabbit@host amqp://user:pass@new-host:5672/ --rate 500 --journal replay.journal": "publishes to a running broker",
    "cqforensics republish export-dir/ amqp://... --topology broken/rabbit@host --queue orders --map orders=orders.replayed": "publishes to a running broker (amqp://... stands for its URL)",
    "cqforensics republish rescued/rabbit@host/lost+found amqp://... --since 2026-11-20T00:00:00Z --ids ids.txt": "publishes to a running broker (amqp://... stands for its URL)",
}


def _lines(page: Path) -> list[str]:
    """The page's ```sh lines to run, in order: commands, and the setup lines around them."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```", page.read_text(), re.M | re.S):
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("cqforensics ") or line.startswith(SETUP):
                out.append(line)
    return out


def _commands(page: Path) -> list[str]:
    return [line for line in _lines(page) if line.startswith("cqforensics ")]


RUN = [p for p in PAGES if _commands(p)]


def _shell_line(line: str, tmp: Path) -> str:
    """The line as it runs here: comments dropped, the samples named from the checkout, /tmp/ and
    ~ inside the test's dir, and the parent dir of a redirection's target made first."""
    line = re.sub(r"\s+#\s.*$", "", line)
    # /tmp/ and ~ first: the checkout itself may lie under /tmp (a CI clone)
    line = re.sub(r"(?<![\w/.])/tmp/", f"{tmp}/", line).replace("~/", f"{tmp}/home/")
    line = re.sub(r"(?<![\w/.])sample_data/", f"{ROOT}/sample_data/", line)
    for target in re.findall(r"(?<![<2&])>\s*(\S+)", line):
        (tmp / target).parent.mkdir(parents=True, exist_ok=True)  # an absolute target wins the join
    return line


def _run(line: str, tmp: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        HOME=str(tmp / "home"),
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    script = (
        f'set -o pipefail\ncqforensics() {{ {shlex.quote(sys.executable)} -m cli.main "$@"; }}\n'
        f"{_shell_line(line, tmp)}\n"
    )
    return subprocess.run(["bash", "-c", script], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


def test_the_docs_show_commands_and_skip_few():
    shown = [c for p in PAGES for c in _commands(p)]
    assert len(shown) >= 20, shown
    gone = set(SKIPPED) - {re.sub(r"\s+#\s.*$", "", c) for c in shown}
    assert not gone, f"SKIPPED names commands the docs no longer show: {gone}"
    assert len(SKIPPED) <= 5  # short and explicit: a command the docs show runs in this test


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN, ids=[str(p.relative_to(ROOT)) for p in RUN])
def test_every_command_of_the_page_runs(page, tmp_path):
    (tmp_path / "home").mkdir()
    ran = 0
    try:
        for line in _lines(page):
            if re.sub(r"\s+#\s.*$", "", line) in SKIPPED:
                continue
            p = _run(line, tmp_path)
            assert "Traceback" not in p.stderr, f"{line}\n{p.stderr[-3000:]}"
            if line.startswith(SETUP):
                assert p.returncode == 0, f"{line}: exit {p.returncode}\n{p.stderr[-2000:]}"
            else:
                assert p.returncode < 8, f"{line}: exit {p.returncode}\n{p.stderr[-2000:]}"
                ran += 1
    finally:  # the runbook makes its evidence copy read-only; let pytest remove it
        subprocess.run(["chmod", "-R", "u+w", str(tmp_path)], check=False)
    assert ran
