"""Every rule of the shipped reference has a test named after it, and every test that names a
rule names one the reference knows.

A test proves a rule by its name: ``test_R2_...`` (or ``test_A16_C7_...`` for several). This
check reads the test files (no import, no run): a rule with no test, a test that names an id the
reference lacks, or a rule whose only tests are skipped or expected to fail unconditionally, fails
the build. A green suite then means every rule has a passing test."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

from scratchbank.adapters.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
TEST_DIRS = ("tests", "property_tests")
#: The leading run of rule ids in a test's name: test_A16_C7_staggered... -> A16, C7.
LEADING_IDS = re.compile(r"^test_((?:[A-Z]\d{1,2}_)+)")


def _unconditionally_skipped(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = ast.unparse(target)
        if name in ("pytest.mark.skip", "pytest.mark.xfail"):
            return True
    return False


@functools.cache  # every file parsed once per session (three tests read it)
def rule_tests() -> dict[str, list[tuple[str, bool]]]:
    """Rule id -> [(file::test, runs)] for every test function whose name leads with ids."""
    found: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for folder in TEST_DIRS:
        for path in sorted((ROOT / folder).rglob("test_*.py")):
            for fn in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                match = LEADING_IDS.match(fn.name)
                if not match:
                    continue
                where = f"{path.relative_to(ROOT)}::{fn.name}"
                for rule_id in match.group(1).strip("_").split("_"):
                    found[rule_id].append((where, not _unconditionally_skipped(fn)))
    return found


def test_every_rule_of_the_reference_has_a_test_that_runs() -> None:
    """Each id of the shipped reference (T, S, R, X, C, L, N, A, K) leads the name of a test that is
    neither skipped nor expected to fail unconditionally."""
    found = rule_tests()
    missing = sorted(rid for rid in RULES if not any(runs for _where, runs in found.get(rid, ())))
    assert missing == [], f"rules without a running test: {missing}"


def test_every_id_a_test_names_is_a_rule_of_the_reference() -> None:
    """A test named ``test_<ID>_`` claims to prove rule ID: the id must exist in the reference, so
    a build item or a finding number never poses as a rule."""
    unknown = {rid: [w for w, _ in where] for rid, where in rule_tests().items() if rid not in RULES}
    assert unknown == {}, f"tests naming ids the rule reference lacks: {unknown}"


def test_the_check_sees_a_planted_rule_without_a_test() -> None:
    """The check can fail: a rule id no test names is reported missing."""
    found = rule_tests()
    assert "R2" in found and "Z99" not in found
    assert any(runs for _w, runs in found["R2"])


def test_the_pure_tier_refuses_a_process_and_a_connection() -> None:
    """This file is in the pure tier (tests/tiers.py): the guard makes a process or a socket
    connection fail the test, so a test placed there really needs neither."""
    import socket
    import subprocess

    import pytest
    from tiers import ImpureCall

    with pytest.raises(ImpureCall):
        subprocess.run(["true"], check=False)
    with socket.socket() as sock, pytest.raises(ImpureCall):
        sock.connect(("127.0.0.1", 9))


def test_every_file_a_tier_names_exists() -> None:
    """A tier's list names only test files that exist (a renamed file is placed again)."""
    from tiers import ADAPTERS, PURE

    stems = {p.stem for folder in TEST_DIRS for p in (ROOT / folder).glob("test_*.py")}
    assert (PURE | ADAPTERS) - stems == set()


def test_every_rule_test_is_filed_in_its_familys_file() -> None:
    """A test named after rules lives in tests/rules/, in a file of its first id's family
    (test_R.py, test_R_adapters.py, test_R_engines.py, or one of the family set apart:
    test_R_<where it came from>.py), so a rule's tests are found in one place."""
    misfiled = [
        where
        for found in rule_tests().values()
        for where, _runs in found
        if where.startswith("tests/")
        and not re.match(rf"tests/rules/test_{where.split('::')[1][5]}(_\w+)?\.py::", where)
    ]
    assert misfiled == [], f"rule tests outside their family's file in tests/rules/: {sorted(set(misfiled))}"


#: The product's packages (pyproject's package-dir): a rule test's docstring names one of their
#: functions or classes. scratchbank.testing is the tests' own kit, not the product.
PRODUCT_DIRS = ("domain", "application", "adapters", "src/scratchbank")
#: A name in a docstring: ``scratchbank.x.y`` dotted, or a bare identifier (in backticks or
#: called, ``name()``, or shaped like code: snake_case or CamelCase, so an English word such as
#: "resume" is not taken for the function of that name).
NAME_IN_PROSE = re.compile(r"(`{1,2})?\b(scratchbank(?:\.\w+)+|[A-Za-z_]\w*)\b(\(\))?")


@functools.cache
def product_names() -> frozenset[str]:
    """Every function, method and class the product defines (by reading its files)."""
    names: set[str] = set()
    for folder in PRODUCT_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            if "testing" in path.relative_to(ROOT / folder).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                defined = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                if defined and not node.name.startswith("__"):
                    names.add(node.name)
    return frozenset(names)


def names_a_product_function(doc: str, names: frozenset[str] = frozenset()) -> bool:
    """``doc`` names a function or class of the product (see NAME_IN_PROSE)."""
    names = names or product_names()
    for match in NAME_IN_PROSE.finditer(doc):
        tick, name, call = match.groups()
        if name.startswith("scratchbank.") and name.rsplit(".", 1)[-1] in names:
            return True
        code_shaped = "_" in name.strip("_") or any(c.isupper() for c in name[1:])
        if name in names and (tick or call or code_shaped):
            return True
    return False


def rule_tests_without_a_named_function() -> list[str]:
    """The rule tests of tests/rules/ whose docstring names no function or class of the product."""
    silent = []
    for path in sorted((ROOT / "tests" / "rules").glob("test_*.py")):
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            is_rule_test = isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and LEADING_IDS.match(
                fn.name
            )
            if is_rule_test and not names_a_product_function(ast.get_docstring(fn) or ""):
                silent.append(f"{path.relative_to(ROOT)}::{fn.name}")
    return silent


def test_every_rule_test_names_the_product_function_it_proves() -> None:
    """Issue 22 item 3: a rule test's docstring names the domain or application function (or the
    adapter's class) it proves, ``scratchbank.``-dotted or by a bare name the product defines, so
    a reader goes from the rule to the code in one step."""
    silent = rule_tests_without_a_named_function()
    assert silent == [], (
        f"rule tests whose docstring names no product function ({len(silent)}): {silent}; add the one it"
        " proves, e.g. 'Proves ``scratchbank.application.resume.resume``.'"
    )


def test_the_docstring_check_tells_a_name_from_a_word() -> None:
    """The check can fail: an English word is not a name; backticks, a call or code shape are."""
    names = frozenset({"decide_resume", "Consents", "ResumeRequest", "resume"})
    assert not names_a_product_function("A resume is refused.", names)
    assert not names_a_product_function("", names)
    assert names_a_product_function("``resume`` refuses.", names)
    assert names_a_product_function("resume() refuses.", names)
    assert names_a_product_function("decide_resume refuses.", names)
    assert not names_a_product_function("Consents name it.", names)  # a sentence's first word
    assert names_a_product_function("``Consents`` name it.", names)
    assert names_a_product_function("A ResumeRequest names it.", names)
    assert names_a_product_function("scratchbank.domain.decide_resume refuses.", names)
    assert not names_a_product_function("scratchbank.domain.no_such_thing refuses.", names)
