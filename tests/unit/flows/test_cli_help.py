"""Every `slm-nightly … --help` says what the command does (issue 23: subcommands whose --help
had no description)."""

import argparse

from flows.cli import build_parser


def _leaves(parser: argparse.ArgumentParser, path: str = "slm-nightly"):  # type: ignore[no-untyped-def]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub, helps.get(name)
                yield from _leaves(sub, f"{path} {name}")


def test_every_subcommand_describes_itself() -> None:
    seen = {}
    for path, sub, listed in _leaves(build_parser()):
        assert listed, f"{path}: no help line in its parent's list"
        text = sub.format_help()
        first = str(listed).split()[0]
        assert sub.description and sub.description.lower().startswith(first.lower()), path
        assert sub.description.split()[0] in text
        seen[path] = sub.description
    assert seen["slm-nightly graph stats"] == "Node and relationship counts by type."
    assert seen["slm-nightly adapters rollback"] == \
        "Back to the previously promoted adapter."
    assert len(seen) >= 25
