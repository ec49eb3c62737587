"""The one error table (code, exit status, HTTP status, MCP error), the README that prints it,
remedies in each surface's words, and the shipped rule reference every refusal line names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from operator_rigs import RUN, cli, parked_run

from scratchbank.adapters import cli as cli_module
from scratchbank.adapters import error_table, http_api
from scratchbank.adapters.bootstrap import open_home
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.adapters.present import decision_text
from scratchbank.adapters.rules import RULES
from scratchbank.domain import errors
from scratchbank.domain.admission import Consents
from scratchbank.domain.fold import fold
from scratchbank.domain.resume_gate import ResumeRequest, decide_resume
from scratchbank.testing.builders import banked, node, started

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_error_class_of_the_domain_has_its_own_row() -> None:
    """A code that lands in domain/errors.py gets a row here (its family answers until then)."""
    missing = [cls.__name__ for cls in error_table.all_error_classes() if cls not in error_table.ROWS]
    assert not missing, f"add rows to adapters/error_table.py for: {missing}"


def test_a_new_error_subclass_answers_as_its_family() -> None:
    """An error class without a row of its own takes its nearest ancestor's row."""

    class LockHeld(errors.SandboxError):
        code = "LOCK_HELD_EXAMPLE"

    class Refusal(errors.SurfaceError):
        code = "SURFACE_EXAMPLE"

    assert error_table.row_of(LockHeld("x")) == error_table.ROWS[errors.SandboxError]
    assert error_table.exit_code(Refusal("x")) == 2 and error_table.http_status(Refusal("x")) == 400


def test_the_cli_and_the_api_read_the_one_table() -> None:
    """Every class answers the table's exit status on the CLI and its status over HTTP."""
    for cls in error_table.all_error_classes():
        error = cls("x")
        row = error_table.row_of(cls)
        assert cli_module.exit_code(error) == row.exit, cls
        assert http_api.status_of(error) == row.http, cls


def test_the_readme_prints_the_table_the_code_has() -> None:
    """The README's error table is error_table.markdown(), word for word."""
    assert error_table.markdown() in README.read_text(), "regenerate the README's error table"


@pytest.mark.parametrize("surface", ["http", "mcp", "python"])
def test_remedies_speak_the_surfaces_words_not_cli_flags(surface: error_table.Surface) -> None:
    """No remedy or hint names a CLI flag off the CLI (--accept-scratch-loss, --force, --sandbox, --home)."""
    for cls in error_table.all_error_classes():
        text = error_table.remedy_for(cls("x"), surface)
        assert not re.search(r"--(accept-scratch-loss|force|sandbox|home)\b", text), (cls, text)
    stale = fold([started(), node("a", "tool"), banked(), node("b", "tool")])
    decision = decide_resume(stale, ResumeRequest(consents=Consents(force=True), source_changed=True))
    hint = error_table.render(" ".join(decision_text(decision)), surface)
    assert "--" not in hint, hint


def test_rules_R2_prints_the_shipped_reference(tmp_path: Path) -> None:
    """`scratchbank rules R2` from the package; an unknown id is CONFIG_INVALID."""
    done = cli("rules", "R2", home=None)
    assert done.returncode == 0 and done.stdout.startswith("R2: a node ran after the bank")
    assert "RULES.md" not in done.stdout
    every = cli("rules", home=None).stdout.splitlines()
    assert len(every) == len(RULES) >= 80
    bad = cli("rules", "Z9", home=None)
    assert bad.returncode == 2 and "CONFIG_INVALID" in bad.stderr


def test_the_refusal_on_the_cli_names_the_rule_in_words(tmp_path: Path) -> None:
    """The installed command's refusal line says R2 in words."""
    parked_run(tmp_path, stale=True)
    done = cli("status", RUN, home=tmp_path)
    assert f"(R2: {RULES['R2'].title})" in done.stdout, done.stdout


@pytest.mark.parametrize("cls", error_table.all_error_classes(), ids=lambda c: c.code)
def test_every_named_error_raised_to_an_engine_says_its_remedy_in_python(
    cls: type[errors.ScratchbankError],
) -> None:
    """The error table, row by row: `remedy` stays the CLI's words; what the exception says
    to an engine (str) is the Python rendering, with no CLI flag in it."""
    error = cls("x")
    text = str(error)
    assert text == f"{cls.code}: x (remedy: {error.remedy_in('python')})"
    assert error.remedy_in("cli") == error.remedy
    assert error.remedy_in("python") == error_table.remedy_for(error, "python")
    assert not re.search(r"--[a-z]", text), text
    if "--" in error.remedy or "`status`" in error.remedy or "its status" in error.remedy:
        assert error.remedy_in("python") != error.remedy, error.remedy


def test_the_api_raises_with_python_names_the_cli_says_flags(tmp_path: Path) -> None:
    """Raised by the library to an engine: Target(...) and open_home(DIR), not --sandbox or
    --home; the CLI says the flags for the same error."""
    with open_home(tmp_path) as service:
        service.timeline.append(RUN, [started(), node("a", "tool")])
        service.bank_at_teardown(RUN, FakeSandbox({"a.txt": b"x"}), run_finished=False)
        with pytest.raises(errors.NoRestoreTarget) as no_target:
            service.resume(RUN)
        with pytest.raises(errors.RunNotFound) as not_found:
            service.status("never-seen")
    assert "Target(sandbox=...)" in str(no_target.value) and "--sandbox" not in str(no_target.value)
    assert "--sandbox" in error_table.remedy_for(no_target.value, "cli")
    assert "open_home(DIR)" in str(not_found.value) and "--home" not in str(not_found.value)
    assert "--home" in error_table.remedy_for(not_found.value, "cli")
    gone = errors.ResumeSuperseded("another resume holds run-9")
    assert "service.status(run_id)" in str(gone), str(gone)
