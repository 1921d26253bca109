"""The harness asks its polled questions in its own process (spotmorph.local.cli_calls.ask): against a real
controller, each answer (exit code, stdout, stderr) is the one ``spotmorph`` gives as a process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.client.context import Context, write_context
from spotmorph.local.cli_calls import ROOT, CommandFailed, ask, spotmorph
from spotmorph.local.harness import cluster_env

from .conftest import Live

QUESTIONS = (
    ("jobs", "--json"),
    ("nodes", "--json"),
    ("events", "--json"),
    ("status", "job-404", "--json"),
    ("status", "--no-such-flag"),
)


@pytest.mark.slow
def test_each_question_asked_in_process_is_answered_as_the_command_answers_it(live: Live, tmp_path: Path) -> None:
    token = live.token("operator")
    home = tmp_path / "home"
    token_file = tmp_path / "operator.token"
    token_file.write_text(token)
    write_context(Context(controller=live.address, token_file=str(token_file)), home)
    env = cluster_env(home)
    for question in QUESTIONS:
        inside = ask(question, live.address, token, check=False)
        outside = subprocess.run(spotmorph(*question), capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert (inside.returncode, inside.stdout, inside.stderr) == (
            outside.returncode,
            outside.stdout,
            outside.stderr,
        ), question
    answered = {question: ask(question, live.address, token, check=False).returncode for question in QUESTIONS}
    assert list(answered.values()) == [0, 0, 0, 3, 2], answered  # answers and refusals both compared


def test_a_wrong_token_is_refused_in_process_as_it_is_outside(live: Live) -> None:
    refused = ask(("jobs",), live.address, "not-a-token", check=False)
    assert refused.returncode == 4 and "UNAUTHENTICATED" in refused.stderr, refused


def test_a_failed_question_raises_with_what_the_command_said(live: Live) -> None:
    with pytest.raises(CommandFailed, match="exited 3"):
        ask(("status", "job-404"), live.address, live.token("operator"))
