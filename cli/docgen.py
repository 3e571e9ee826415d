"""Shell completion and the man page, generated from the argparse definitions (``build_parser``),
so they cannot drift from the CLI: ``cqforensics completion bash|zsh`` and ``cqforensics
manpage`` (roff, section 1), e.g. ``cqforensics manpage > /usr/local/share/man/man1/cqforensics.1``
and ``source <(cqforensics completion bash)``."""

from __future__ import annotations

import argparse
import datetime as dt


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help is not argparse.SUPPRESS]


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]


def _words(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in _options(parser) for o in a.option_strings)


def bash(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    subs = _subparsers(parser)
    cases = []
    for name, sp in subs.items():
        choices = {o: list(a.choices) for a in _options(sp) if a.choices for o in a.option_strings}
        takes = sorted(o for a in _options(sp) if a.nargs != 0 and not a.choices for o in a.option_strings)
        choice_cases = "".join(
            f'            {o}) COMPREPLY=($(compgen -W "{" ".join(map(str, c))}" -- "$cur")); return;;\n'
            for o, c in sorted(choices.items())
        )
        cases.append(
            f'        {name})\n          case "$prev" in\n{choice_cases}'
            f'            {"|".join(takes) or "__none__"}) COMPREPLY=($(compgen -f -- "$cur")); return;;\n'
            f"          esac\n"
            f'          if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "{" ".join(_words(sp))}" -- "$cur"));'
            f' else COMPREPLY=($(compgen -f -- "$cur")); fi;;\n'
        )
    return f"""# bash completion for {prog} (generated from its argparse definitions: {prog} completion bash)
_{prog}() {{
    local cur prev cmd i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            {"|".join(subs)}) cmd="${{COMP_WORDS[i]}}"; break;;
        esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "{" ".join(list(subs) + _words(parser))}" -- "$cur"))
        return
    fi
    case "$cmd" in
{"".join(cases)}    esac
}}
complete -o filenames -F _{prog} {prog}
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    subs = _subparsers(parser)

    def quote(t: str) -> str:
        return (t or "").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")

    funcs = []
    for name, sp in subs.items():
        specs = []
        for a in _options(sp):
            arg = (
                ""
                if a.nargs == 0
                else (f":{a.dest}:({' '.join(map(str, a.choices))})" if a.choices else f":{a.dest}:_files")
            )
            for o in a.option_strings:
                specs.append(f"'{o}[{quote(a.help)}]{arg}'")
        specs.append("'*:file:_files'")
        funcs.append(f"    {name}) _arguments {' '.join(specs)};;\n")
    listing = " ".join(
        f"'{n}:{quote(sp.description.splitlines()[0] if sp.description else '')}'" for n, sp in subs.items()
    )
    return f"""#compdef {prog}
# zsh completion for {prog} (generated from its argparse definitions: {prog} completion zsh)
_{prog}() {{
    local -a commands
    commands=({listing})
    if (( CURRENT == 2 )); then
        _describe 'command' commands
        _arguments {" ".join(f"'{o}'" for o in _words(parser))}
        return
    fi
    case "$words[2]" in
{"".join(funcs)}    esac
}}
_{prog} "$@"
"""


def _roff(text: str | None) -> str:
    text = " ".join((text or "").split())
    text = text.replace("\\", "\\\\").replace("-", "\\-")
    return ("\\&" + text) if text.startswith((".", "'")) else text


def manpage(parser: argparse.ArgumentParser, version: str = "") -> str:
    prog = parser.prog
    date = dt.date.today().isoformat()
    out = [
        f'.TH {prog.upper()} 1 "{date}" "{prog} {version}" "User Commands"',
        ".SH NAME",
        f"{prog} \\- {_roff(parser.description)}",
        ".SH SYNOPSIS",
        f".B {prog}\n[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]",
        ".SH GLOBAL OPTIONS",
    ]
    for a in _options(parser):
        out += [".TP", "\\fB" + ", ".join(_roff(o) for o in a.option_strings) + "\\fR", _roff(a.help)]
    out.append(".SH COMMANDS")
    for name, sp in _subparsers(parser).items():
        usage = " ".join(sp.format_usage().split()[1:])
        out += [f".SS {name}", f".B {_roff(usage)}", ".PP", _roff(sp.description)]
        for a in _positionals(sp):
            out += [".TP", f"\\fI{_roff(a.metavar or a.dest)}\\fR", _roff(a.help)]
        for a in _options(sp):
            meta = (
                ""
                if a.nargs == 0
                else " \\fI"
                + _roff(a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else a.dest.upper()))
                + "\\fR"
            )
            out += [".TP", "\\fB" + ", ".join(_roff(o) for o in a.option_strings) + "\\fR" + meta, _roff(a.help)]
    out += [
        ".SH EXIT STATUS",
        "0 no errors; 1 errors found and fixed; 4 errors found and left; 8 operational "
        "error; 16 usage error; 32 interrupted.",
        ".SH SEE ALSO",
        "docs/ of the cqforensics sources (mkdocs build), and docs/reference/cli.md.",
    ]
    return "\n".join(out) + "\n"


def _md(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|").replace("<", "&lt;")


def markdown(parser: argparse.ArgumentParser) -> str:
    """The command reference page of the docs site (``docs/reference/cli.md``), one section per
    command: its usage, description, arguments and options, as ``--help`` gives them.
    ``python3 -m cli.docgen > docs/reference/cli.md`` writes it; a test checks it is current."""
    prog = parser.prog
    out = [
        f"# Command reference: `{prog}`",
        "",
        f"Generated from the parser (`python3 -m cli.docgen > docs/reference/cli.md`), like `{prog} manpage` "
        f"and `{prog} completion`; a test fails when it is out of date. Exit codes: "
        "[Findings and exit codes](../findings.md#exit-codes).",
        "",
        "## Global options",
        "",
        "| option | meaning |",
        "|---|---|",
    ]
    for a in _options(parser):
        if a.dest == "help":
            continue
        out.append(f"| `{', '.join(a.option_strings)}` | {_md(a.help)} |")
    for name, sp in _subparsers(parser).items():
        usage = " ".join(sp.format_usage().split()[1:])
        out += ["", f"## {name}", "", "```text", usage, "```", "", _md(sp.description)]
        rows = [(f"`{a.metavar or a.dest}`", a.help) for a in _positionals(sp)]
        for a in _options(sp):
            if a.dest == "help":
                continue
            meta = (
                ""
                if a.nargs == 0
                else " " + (a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else a.dest.upper()))
            )
            rows.append((f"`{', '.join(a.option_strings)}{meta}`", a.help))
        if rows:
            out += ["", "| argument | meaning |", "|---|---|"] + [f"| {k} | {_md(h)} |" for k, h in rows]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    from cli.main import build_parser

    print(markdown(build_parser()), end="")
