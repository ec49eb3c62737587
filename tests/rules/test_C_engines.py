"""Rules C: consents and the runner's deliveries. The engines tier's tests of C2, C4, C5, C6, C7, C9,
C10 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats_server import nats_url  # noqa: F401 - a fixture
from operator_rigs import RUN, TOKEN, served
from race_workers import FILES
from rigs import lossy_runner
from rigs.http_api import (
    AUTH,
    api,  # noqa: F401 - a fixture
    home,  # noqa: F401 - a fixture
    service,  # noqa: F401 - a fixture
)
from rigs.lossy_runner import (
    UNBANKED,
    LosesReply,
    MovesBeforeQueue,
    store_under,  # noqa: F401 - a fixture
)
from rigs.queue_deployment import (
    ENGINE_REFUSES,
    _append,
    _handled,
    _records,
    _resume,
    _run,
    deployment,  # noqa: F401 - a fixture
)
from rigs.racing_processes import (
    COUNTS,
    PARKED,
    ROUNDS,
    SHAPES,
    race,
    racers,  # noqa: F401 - a fixture
    store_url,  # noqa: F401 - a fixture
)
from runner_rigs import ACCEPT, checksum, make_rig, queue_resume

import scratchbank.application.runner as runner_module
from scratchbank.adapters.bootstrap import bootstrap, close, open_home
from scratchbank.adapters.config import settings_from
from scratchbank.adapters.http_api import ApiSettings
from scratchbank.adapters.inprocess import InProcessQueue
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.application.runner import Handled
from scratchbank.application.service import ScratchService
from scratchbank.domain.errors import TimelineConflict
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
    ResumeRefused,
    RunResumed,
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import ResumeRequest, Verdict
from scratchbank.testing.builders import node

# ---- from tests/test_http_api.py: The HTTP API over a real loopback socket (uvicorn), called with httpx: C9's refusal body, the bearer token, the Host check, the body limit, unknown fields, the sandbox allow-list, and an OpenAPI document that lists every response (issue 12, findings 1, 2, 5).


def test_C9_refusal_body_with_hint_and_also_needs_force(api: httpx.Client, service: ScratchService) -> None:
    """C9: a refusal is a 400 with the code, the hint and also_needs_force."""
    service.timeline.append(RUN, [node("measure", "agent")])
    got = api.post(f"/runs/{RUN}/resume", json={"source_changed": True}, headers=AUTH)
    body = got.json()
    assert got.status_code == 400 and body["error_code"] == "scratch_not_portable"
    assert body["also_needs_force"] is True and body["keep_force"] is False
    assert 'add "force": true' in body["hint"] and body["hint"].startswith("relaunch the run fresh")
    assert "--" not in body["hint"] + body["remedy"]  # the API's JSON fields, never the CLI's flags


def test_C9_A9_a_call_that_had_force_is_told_to_keep_it(api: httpx.Client, service: ScratchService) -> None:
    """C9, A9: a call that had --force is told to keep it.
    Proves ``scratchbank.domain.resume_gate.ResumeDecision.keep_force``."""
    service.timeline.append(RUN, [node("measure", "agent")])
    body = api.post(f"/runs/{RUN}/resume", json={"source_changed": True, "force": True}, headers=AUTH).json()
    assert (
        body["also_needs_force"] is False
        and body["keep_force"] is True
        and 'keep "force": true' in body["hint"]
    )


# ---- from tests/rules/test_[AC]*.py: Claims under real races (C7, R10, A16): 2 to 8 processes on one parked run, on SQLite and on PostgreSQL, resumes against resumes and against a teardown, under the run's lock.


@pytest.mark.parametrize(("resumes", "teardowns"), SHAPES, ids=[f"{r}r+{t}t" for r, t in SHAPES])
def test_C7_exactly_one_racer_claims_the_run_and_the_others_write_nothing(
    racers: tuple[Any, Any, Any], store_url: str, tmp_path: Path, resumes: int, teardowns: int
) -> None:
    """Exactly one racer claims the run and the others write nothing:
    ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    backend = store_url.split(":", 1)[0]
    counts = COUNTS.setdefault(f"{backend} {resumes}r+{teardowns}t", {})
    for _ in range(ROUNDS):
        got, after = race(racers, store_url, tmp_path / "banks", resumes, teardowns)
        outcomes = [g["result"] for g in got if g["role"] == "resume"]
        teardown = [g["result"] for g in got if g["role"] == "teardown"]
        kinds = [type(r).__name__ for r in after]
        # exactly one resume restores; every other resume is superseded
        assert outcomes.count("restored") == 1, (outcomes, kinds)
        losers = outcomes.count("superseded") + outcomes.count("locked")
        assert losers == resumes - 1, (outcomes, kinds)
        assert [g["files"] for g in got if g.get("result") == "restored"] == [FILES]
        # the losers wrote nothing: one claim, one restore record, at most the teardown's
        assert sum(isinstance(r, RunResumed) for r in after) == 1, kinds
        assert sum(isinstance(r, ScratchRestored) for r in after) == 1, kinds
        recorded = teardown.count("recorded")
        assert sum(isinstance(r, ScratchBanked) for r in after) == recorded, (teardown, kinds)
        if recorded:  # the parked execution's teardown won: it recorded before every claim
            assert isinstance(after[0], ScratchBanked) and after[0].execution == PARKED, kinds
        assert len(after) == 2 + recorded, kinds
        for key in ("rounds", f"teardown {'won' if recorded else 'lost'}" if teardowns else ""):
            if key:
                counts[key] = counts.get(key, 0) + 1
        counts["losers' writes"] = counts.get("losers' writes", 0) + len(after) - 2 - recorded
        counts["superseded"] = counts.get("superseded", 0) + outcomes.count("superseded")
        counts["locked"] = counts.get("locked", 0) + outcomes.count("locked")
    print(f"\nraces {COUNTS}")


# ---- from tests/rules/test_[CL]*.py: The runner and the queue, exactly once (issue #19): a claim whose reply was lost keeps its consent (C4), one queueing path at the judged version (C5, C6), every lost append settled by reading.


def test_C4_a_claim_whose_reply_was_lost_keeps_its_consent(
    tmp_path: Path, store_under: Timeline | None
) -> None:
    """The claim committed but its reply was lost: read, found ours, carried on with the delivery's
    consent (the loss accepted), never refused R2 and never left `running` with nobody on it.
    Proves ``scratchbank.domain.errors.TimelineWriteFailed``."""
    tl = LosesReply(AttemptClaimed, landed=True, inner=store_under)
    rig = make_rig(tmp_path, tl)
    tl.append(lossy_runner.RUN, [RunStarted(), UNBANKED])
    queue_resume(tl, rig.queue, lossy_runner.RUN, "a1", ACCEPT)
    handled = rig.runner().run_once(1)
    assert tl.fired
    assert handled is not None and handled.handled is Handled.RAN, handled and handled.detail
    records = tl.read(lossy_runner.RUN)
    assert [r.attempt for r in records if isinstance(r, AttemptClaimed)] == ["a1"]
    assert not [r for r in records if isinstance(r, ResumeRefused)]
    accepted = [r for r in records if isinstance(r, ScratchRestored)]
    assert accepted and accepted[0].accepted


def test_C4_a_claim_that_did_not_land_is_claimed_again_with_its_consent(
    tmp_path: Path, store_under: Timeline | None
) -> None:
    """The claim's write failed before it committed: nothing landed, the delivery comes back and
    claims with its consent (the records say the run is still queued for it).
    Proves ``scratchbank.domain.errors.TimelineWriteFailed``."""
    tl = LosesReply(AttemptClaimed, landed=False, inner=store_under)
    rig = make_rig(tmp_path, tl)
    tl.append(lossy_runner.RUN, [RunStarted(), UNBANKED])
    queue_resume(tl, rig.queue, lossy_runner.RUN, "a1", ACCEPT)
    runner = rig.runner()
    first = runner.run_once(1)
    assert first is not None and first.handled is Handled.REDELIVER, first.detail
    assert not [r for r in tl.read(lossy_runner.RUN) if isinstance(r, AttemptClaimed)]
    second = runner.run_once(5)
    assert second is not None and second.handled is Handled.RAN, second.detail
    accepted = [r for r in tl.read(lossy_runner.RUN) if isinstance(r, ScratchRestored)]
    assert accepted and accepted[0].accepted


def test_C6_one_queueing_path_the_runner_keeps_no_copy() -> None:
    """Queueing is the service's alone (at the judged version): the runner has no queue_resume."""
    assert not hasattr(runner_module, "queue_resume")


def test_C6_a_queue_judged_before_a_resume_claimed_queues_nothing() -> None:
    """The run moved between the surface's judgement and its queueing: TimelineConflict,
    nothing queued, nothing published; the resume that won keeps its records."""
    from scratchbank.domain.records import RunResumed

    tl = MovesBeforeQueue([RunResumed(attempt="other")])
    tl.append(lossy_runner.RUN, [RunStarted()])
    queue = InProcessQueue()
    service = ScratchService(tl, InMemoryBankStore(), queue=queue)
    with pytest.raises(TimelineConflict):
        service.queue_resume(lossy_runner.RUN, ResumeRequest(), attempt="a1")
    assert [r.WIRE for r in tl.read(lossy_runner.RUN)] == ["run_started", "run_resumed"]
    assert queue.fetch(0.01) is None


def test_C5_an_attempt_queued_whose_reply_was_lost_is_settled_by_reading_and_published() -> None:
    """attempt_queued committed but its reply was lost: read, found ours, published once.
    Proves ``scratchbank.adapters.inprocess.InProcessQueue``."""
    tl = LosesReply(AttemptQueued, landed=True)
    tl.append(lossy_runner.RUN, [RunStarted()])
    queue = InProcessQueue()
    service = ScratchService(tl, InMemoryBankStore(), queue=queue)
    queued = service.queue_resume(lossy_runner.RUN, ResumeRequest(), attempt="a1")
    assert tl.fired and queued.attempt == "a1"
    inbound = queue.fetch(0.01)
    assert inbound is not None and inbound.delivery.attempt == "a1"
    assert [r.WIRE for r in tl.read(lossy_runner.RUN)] == ["run_started", "attempt_queued"]


def test_C5_a_reused_attempt_id_is_refused_by_name_and_changes_nothing() -> None:
    """A caller-supplied attempt id this run was already queued for: ATTEMPT_REUSED, nothing
    written, nothing published (the stream would de-duplicate it silently).
    Proves ``scratchbank.adapters.inprocess.InProcessQueue``."""
    from scratchbank.domain.errors import AttemptReused

    tl = InMemoryTimeline()
    tl.append(lossy_runner.RUN, [RunStarted()])
    queue = InProcessQueue()
    service = ScratchService(tl, InMemoryBankStore(), queue=queue)
    service.queue_resume(lossy_runner.RUN, ResumeRequest(), attempt="a1")
    assert queue.fetch(0.01) is not None
    before = checksum(tl, lossy_runner.RUN)
    with pytest.raises(AttemptReused) as refused:
        service.queue_resume(lossy_runner.RUN, ResumeRequest(), attempt="a1")
    assert refused.value.code == "ATTEMPT_REUSED"
    assert checksum(tl, lossy_runner.RUN) == before and queue.fetch(0.01) is None


# ---- from tests/test_surface_queue.py: The operator surfaces publish resumes onto the runner's queue (issue #13 item 1).


def test_C10_the_logged_hint_is_remedy_of_the_engine_decision(deployment: dict[str, Any]) -> None:
    """The hint the runner wrote is remedy() of the decision the engine makes, word for word."""
    d, run = deployment, _run()
    _append(d["home"], run, list(ENGINE_REFUSES))
    out = _resume(d, run)
    assert out.returncode == 0, out.stderr
    _handled(d, run, json.loads(out.stdout)["attempt"])
    service = open_home(d["home"])
    try:
        decision = service.assess(run).decision
    finally:
        close(service)
    assert decision.verdict is Verdict.REFUSE
    hints = [r.hint for r in _records(d["home"], run) if isinstance(r, ResumeRefused)]
    assert hints == [remedy(decision)]


def test_C2_http_resume_carries_this_calls_consent_to_the_runner_and_the_run_goes_on(
    deployment: dict[str, Any],
) -> None:
    """POST /resume with accept_scratch_loss over a queue: 202; the delivery carries the
    consent (C2, C3), the detached runner claims and the run goes on on the bank as it was.
    Proves ``scratchbank.adapters.bootstrap.bootstrap``."""
    d, run = deployment, _run()
    _append(d["home"], run, list(ENGINE_REFUSES))
    service = bootstrap(settings_from({"SCRATCHBANK_HOME": str(d["home"]), "SCRATCHBANK_QUEUE": d["url"]}))
    try:
        with served(service, ApiSettings(TOKEN)) as base:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            body = {"accept_scratch_loss": True}
            answer = httpx.post(f"{base}/runs/{run}/resume", json=body, headers=headers, timeout=60)
    finally:
        close(service)
    assert answer.status_code == 202, answer.text
    attempt = answer.json()["attempt"]
    assert _handled(d, run, attempt)["handled"] == "ran"
    records = _records(d["home"], run)
    assert not [r for r in records if isinstance(r, ResumeRefused)]
    queued = [r for r in records if isinstance(r, AttemptQueued)]
    assert [(q.attempt, q.accept_scratch_loss) for q in queued] == [(attempt, True)]
