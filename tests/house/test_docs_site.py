"""The docs site builds with warnings as errors (``mkdocs build --strict``: every page in the
nav, every link and anchor between pages resolves), and every relative link of README.md and of
the pages names a file that is there."""

from __future__ import annotations

import re
import subprocess
import sys

from support import ROOT, skip_or_fail

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: [text](target) and ![alt](target), the target up to a space, a closing parenthesis or a quote
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s\"']+)")


def _links(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)  # nor does inline code
    return LINK.findall(text)


def test_the_site_builds_strict(tmp_path):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        skip_or_fail("mkdocs is not installed (the `test` extra has it: pip install '.[test]')")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    for page in sorted((ROOT / "docs").rglob("*.md")):  # every page is built (and, strict, in the nav)
        rel = page.relative_to(ROOT / "docs").with_suffix("")
        assert (site / rel / "index.html").is_file() or rel.name == "index", rel


def test_every_relative_link_resolves():
    broken = []
    checked = 0
    for page in PAGES:
        for target in _links(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, mailto:, or an anchor in the page itself (mkdocs --strict checks those)
            path = target.split("#", 1)[0]
            checked += 1
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to no file:\n" + "\n".join(broken)
    assert checked > 50  # the README's and the pages' links were found at all
