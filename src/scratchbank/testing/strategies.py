"""Hypothesis strategies for realistic timelines. Shared by our tests and engines' own.

Needs ``hypothesis`` (the ``test`` extra). Node names come from a small pool so that
rewinds, repeats and cycles meet the same nodes often.
"""

from __future__ import annotations

from hypothesis import strategies as st

from scratchbank.domain.admission import Consents
from scratchbank.domain.kinds import ENGINE_SIDE_KINDS, SANDBOX_KINDS
from scratchbank.domain.records import (
    NodeFinished,
    Record,
    RunResumed,
    RunRewound,
    RunStarted,
    SandboxShared,
    ScratchBanked,
    ScratchForsaken,
    ScratchRestored,
    UnknownRecord,
)
from scratchbank.domain.resume_gate import ResumeRequest, Where
from scratchbank.domain.teardown import Archive, Seen, TryOutcome

NODES = ("clone", "build", "measure", "loop", "gate")
node_names = st.sampled_from(NODES)
kinds = st.sampled_from([*sorted(SANDBOX_KINDS | ENGINE_SIDE_KINDS), "brand_new_kind"]) | st.none()
maybe_bool = st.none() | st.booleans()

node_finishes = st.builds(
    NodeFinished,
    node=node_names,
    succeeded=st.booleans(),
    kind=kinds,
    answered=st.booleans(),
    in_sandbox=maybe_bool,
    on_cycle=maybe_bool,
)

#: A counted write: a successful, unanswered finish that ran in the sandbox.
sandbox_writes = st.builds(
    NodeFinished,
    node=node_names,
    succeeded=st.just(True),
    kind=st.sampled_from(sorted(SANDBOX_KINDS)),
    in_sandbox=st.just(True),
    on_cycle=maybe_bool,
)

sizes = st.integers(min_value=1, max_value=300 << 20)
digests = st.text("0123456789abcdef", min_size=64, max_size=64)
raced_names = st.lists(st.from_regex(r"\./[a-z]{1,8}", fullmatch=True), max_size=3).map(tuple)

banks = st.builds(
    ScratchBanked,
    banked=st.just(True),
    empty=st.just(False),
    unknown=st.just(False),
    bytes=sizes,
    raced=raced_names,
    unquiesced=st.booleans(),
    sha256=digests,
)
empties = st.just(ScratchBanked(banked=False, empty=True, unknown=False, bytes=0))
unknowns = st.just(ScratchBanked(banked=False, empty=False, unknown=True, bytes=0, reason="gone"))
unbankeds = st.builds(
    ScratchBanked,
    banked=st.just(False),
    empty=st.just(False),
    unknown=st.just(False),
    bytes=st.integers(min_value=0, max_value=1 << 30),
    reason=st.sampled_from(["over the 256 MiB cap", "tar failed", "upload failed"]),
)
finisheds = st.just(ScratchBanked(banked=False, empty=False, unknown=False, finished=True, bytes=0))
teardowns = st.one_of(banks, empties, unknowns, unbankeds, finisheds)

restores = st.builds(
    ScratchRestored,
    restored=st.booleans(),
    stale=st.booleans(),
    accepted=st.booleans(),
    bytes=st.integers(min_value=0, max_value=1 << 20),
    host_backed=st.booleans(),
)
rewinds = st.builds(
    RunRewound,
    dropped_nodes=st.lists(node_names, unique=True, max_size=4).map(tuple),
    on_cycle=st.none() | st.lists(node_names, unique=True, max_size=2).map(tuple),
)
executions = st.one_of(
    st.just(RunStarted()),
    st.builds(RunResumed, force=st.booleans(), accept_scratch_loss=st.booleans()),
)
adoptions = st.builds(SandboxShared, scratch_container_local=maybe_bool, parent_copy_based=st.booleans())
forsakes = st.builds(ScratchForsaken, forced=st.booleans(), accepted=st.booleans())
unknown_types = st.builds(UnknownRecord, type=st.sampled_from(["llm_usage", "artifact_uploaded", "log"]))

#: what any run's own timeline holds (node finishes and teardowns weighted twice)
_OWN = (node_finishes, node_finishes, teardowns, teardowns, restores, rewinds, executions)
records: st.SearchStrategy[Record] = st.one_of(*_OWN, adoptions, forsakes, unknown_types)
#: Timelines that never mention a child adoption: the run's own scratch only.
own_records: st.SearchStrategy[Record] = st.one_of(*_OWN, unknown_types)
timelines = st.lists(records, max_size=40)
own_timelines = st.lists(own_records, max_size=40)

consents = st.builds(Consents, force=st.booleans(), accept_scratch_loss=st.booleans())
requests = st.builds(
    ResumeRequest,
    consents=consents,
    source_changed=st.booleans(),
    artifact_contract_changed=st.booleans(),
    where=st.sampled_from(Where),
)

archives = st.builds(Archive, bytes=sizes, sha256=digests, raced=raced_names)
try_outcomes = st.one_of(
    st.builds(TryOutcome, seen=st.just(Seen.FILES), archive=st.none() | archives, stored=st.booleans()),
    st.builds(TryOutcome, seen=st.sampled_from([Seen.EMPTY, Seen.UNKNOWN])),
).filter(lambda t: not (t.stored and t.archive is None))
