"""Custom search attributes: what operators filter on in the Temporal UI.

Registered automatically by the sandbox; for a production namespace run
``gpu-rl-builder-setup-namespace`` (runtime/namespace_setup.py, also sets retention; see deploy/README.md).
"""

from temporalio.common import SearchAttributeKey

SOURCE_COMMIT = SearchAttributeKey.for_keyword("BuildSourceCommit")
HARBOR_COMMIT = SearchAttributeKey.for_keyword("BuildHarborCommit")
ARCHITECTURE = SearchAttributeKey.for_keyword("BuildArchitecture")
VARIANT = SearchAttributeKey.for_keyword("BuildVariant")
STAGE = SearchAttributeKey.for_keyword("BuildStage")
FAILURE_CLASS = SearchAttributeKey.for_keyword("BuildFailureClass")

ALL = (SOURCE_COMMIT, HARBOR_COMMIT, ARCHITECTURE, VARIANT, STAGE, FAILURE_CLASS)
