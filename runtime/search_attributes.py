"""Custom search attributes: what operators filter on in the Temporal UI.

Registered automatically by the sandbox; for a production namespace run
``gpu-rl-builder-setup-namespace`` (runtime/namespace_setup.py, also sets retention; see deploy/README.md).
"""

import re
from enum import StrEnum

from temporalio.common import SearchAttributeKey

SOURCE_COMMIT = SearchAttributeKey.for_keyword("BuildSourceCommit")
HARBOR_COMMIT = SearchAttributeKey.for_keyword("BuildHarborCommit")
ARCHITECTURE = SearchAttributeKey.for_keyword("BuildArchitecture")
VARIANT = SearchAttributeKey.for_keyword("BuildVariant")
STAGE = SearchAttributeKey.for_keyword("BuildStage")
FAILURE_CLASS = SearchAttributeKey.for_keyword("BuildFailureClass")
# What a run is for, so the build list is not cluttered by plans and schedule validations (`status`
# lists BuildKind = 'build' unless --all). Set at start by whoever starts it (starter, schedule action);
# a run started without it tags itself from its input (BuildPipelineWorkflow: build or plan).
KIND = SearchAttributeKey.for_keyword("BuildKind")

ALL = (SOURCE_COMMIT, HARBOR_COMMIT, ARCHITECTURE, VARIANT, STAGE, FAILURE_CLASS, KIND)


class BuildKind(StrEnum):
    BUILD = "build"  # a real build (starter build, or started by a rebuild check)
    PLAN = "plan"  # build --plan: resolved, nothing submitted
    VALIDATION = "validation"  # the plan that validates a schedule's request before it exists
    REBUILD_CHECK = "rebuild-check"  # a scheduled (or triggered) rebuild check


# Search attributes are the one thing the payload codec does not encode (the server indexes them): a value
# is an identifier (an enum value, a commit SHA, an architecture or variant name), never free text.
_KEYWORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
UNLISTED = "unlisted"


def keyword(value: str) -> str:
    """``value`` if it is an identifier, else ``UNLISTED`` (free text never reaches the server's index)."""
    return value if _KEYWORD.fullmatch(value) else UNLISTED
