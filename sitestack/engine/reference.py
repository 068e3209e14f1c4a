"""The generated parts of docs/playbooks.md: the actions and the facts reference.

``python -m sitestack.engine.reference`` rewrites the text between the ``<!-- BEGIN x -->`` and
``<!-- END x -->`` markers of docs/playbooks.md from the code (action docstrings and
argument metadata, fact metadata), so the reference cannot drift from what the loader
accepts; ``--check`` exits 1 when the file is stale (the docs test runs it).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from collections.abc import Callable

from sitestack.actions import ACTIONS
from sitestack.core.paths import DOCS_DIR
from sitestack.engine import playbook  # noqa: F401  (imports every module that registers actions)
from sitestack.model.site import PLACEHOLDERS, facts_fields, type_name

DOC = DOCS_DIR / "playbooks.md"


def args_table(args_class: type) -> list[str]:
    """The markdown table of an ``Args`` dataclass (its fields' types, docs and defaults)."""
    hints = typing.get_type_hints(args_class)
    fields = dataclasses.fields(args_class)
    if not fields:
        return ["No arguments.\n"]
    out = ["| argument | type | meaning |\n|---|---|---|"]
    for f in fields:
        if f.default is not dataclasses.MISSING:
            default = f" (default `{f.default}`)"
        elif f.default_factory is not dataclasses.MISSING:
            default = " (default: empty)"
        else:
            default = " (required)"
        out.append(f"| `{f.name}` | {type_name(hints[f.name])} | {f.metadata.get('doc', '')}{default} |")
    out.append("")
    return out


def actions_section() -> str:
    out = []
    for name, cls in sorted(ACTIONS.items()):
        doc = "\n".join(line.strip() for line in (cls.__doc__ or "").strip().splitlines())
        out.append(f"### `{name}`\n\n{doc}\n")
        out += args_table(cls.Args)
        # An action that drives package hooks (recipe-install) lists each package's `package:` arguments.
        for recipe, hooks in sorted(getattr(cls, "hooks_table", {}).items()):
            summary = (hooks.__doc__ or "").strip().splitlines()[0] if hooks.__doc__ else ""
            out.append(f"`package:` of recipe `{recipe}`: {summary}\n")
            out += args_table(hooks.Args)
    return "\n".join(out)


def facts_section() -> str:
    rows = ["| key | type | meaning |", "|---|---|---|"]
    rows += [f"| `{key}` | {tp} | {doc} |" for key, tp, doc in facts_fields()]
    return "\n".join(rows) + "\n"


def placeholders_section() -> str:
    rows = ["| placeholder | value |", "|---|---|"]
    rows += [f"| `{{{name}}}` | {value} |" for name, value in PLACEHOLDERS.items()]
    return "\n".join(rows) + "\n"


SECTIONS = {"actions": actions_section, "facts": facts_section, "placeholders": placeholders_section}


def _between_markers(body: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement that keeps a section's markers and puts ``body`` between them."""
    return lambda m: m.group(1) + body + m.group(2)


def render(text: str) -> str:
    """``text`` (docs/playbooks.md) with every generated section between its markers made anew."""
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no <!-- BEGIN {name} --> ... <!-- END {name} --> markers")
        text = pattern.sub(_between_markers(make()), text)
    return text


def main(argv: list[str]) -> int:
    current = DOC.read_text()
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print(f"{DOC} is stale: run `python -m sitestack.engine.reference`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
