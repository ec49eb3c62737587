"""scratchbank: bank a sandboxed run's scratch at teardown, restore it on resume, or
refuse at once with a named cause and a remedy.

The public face. An engine asks two questions::

    from scratchbank import Consents, ResumeRequest, check_resume, plan_teardown, fold

Everything here is re-exported from ``scratchbank.domain`` (pure decisions),
``scratchbank.application`` (use cases over ports) and ``scratchbank.adapters``.
"""

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.application.resume import check_resume
from scratchbank.domain import *  # noqa: F403 - the domain's __all__ is the public vocabulary
from scratchbank.domain import __all__ as _domain_all

__all__ = [*_domain_all, "InMemoryTimeline", "Timeline", "check_resume"]
