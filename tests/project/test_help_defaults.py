"""Every console script's --help says each flag's default once (argparse's own, or the help text's words)."""
from __future__ import annotations

import importlib
import re

import pytest

from model.cli import ehr_adapt, ehr_analyze, ehr_eval, ehr_train
from serving import cli as serve_cli

# The module, not the package's re-exported main function of the same name.
pipeline_main = importlib.import_module("ehr_pipeline.cli.main")


def _pipeline_commands() -> list[str]:
    sub = next(a for a in pipeline_main.build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(sub.choices)


def _help_of(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _flag_helps(text: str) -> list[str]:
    """Each option's help (its lines joined), from --help's text."""
    items, current = [], None
    for line in text.splitlines():
        if re.match(r"^  -", line):
            current = [line]
            items.append(current)
        elif current is not None and line.startswith("   "):
            current.append(line)
        else:
            current = None
    return [" ".join(" ".join(i).split()) for i in items]


MAINS = [("ehr-train", ehr_train.main, []), ("ehr-eval", ehr_eval.main, []), ("ehr-adapt", ehr_adapt.main, []),
         ("ehr-analyze shift", ehr_analyze.main, ["shift"]), ("ehr-serve", serve_cli.main, [])]


@pytest.mark.parametrize("name", [m[0] for m in MAINS])
def test_each_flag_states_its_default_at_most_once(name, capsys):
    _, main, prefix = next(m for m in MAINS if m[0] == name)
    helps = _flag_helps(_help_of(main, [*prefix, "--help"], capsys))
    assert helps
    twice = [h for h in helps if len(re.findall(r"\(default:", h)) > 1]
    assert not twice, f"{name}: defaults said twice: {twice}"


def test_every_pipeline_command_states_each_default_at_most_once(capsys):
    commands = _pipeline_commands()
    assert {"run", "synth", "to-meds"} <= set(commands)
    for command in commands:
        helps = _flag_helps(_help_of(pipeline_main.main, [command, "--help"], capsys))
        twice = [h for h in helps if len(re.findall(r"\(default:", h)) > 1]
        assert not twice, f"ehr-pipeline {command}: defaults said twice: {twice}"
        assert not [h for h in helps if "required" in h and "(default: None)" in h]
