"""The marin-iris release this client was built and tested against.

Why a module, not configuration: the controller's freshness gate compares the client's revision date
with its own build date (0.2.227: refused when more than 14 days older). The real CLI sends the
date of the marin-iris it runs (``iris.version.client_revision_date()``: the wheel's ``BUILD_DATE``);
this service sends the date of the marin-iris its wire code was checked against, so the date moves
only with an upgrade of the client (docs/iris-upgrade.md) and never expires in a config file.
The worker installs marin-iris only for its message classes (docker/iris-protos.txt, without dependencies);
the two values are kept here so the date the service sends is visible in review, and
tests/contract/test_iris_contract.py fails when they differ from the installed marin-iris.
"""

IRIS_VERSION = "0.2.227.dev40316220070"
IRIS_REVISION_DATE = "2026-10-24"  # iris.version.client_revision_date() of IRIS_VERSION (its BUILD_DATE)
