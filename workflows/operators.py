"""Operator commands verified on the worker: one call shared by approve-merge (pipeline) and decide (target).

Why an activity and not the update's validator: validators may not do I/O, and the check needs the
worker's configuration (who is an operator), the GitHub API (team membership) and the server's record
of the update (the caller's Temporal identity). A refusal fails the update with ``NotAuthorized``.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.merge_gate import OperatorActivities
    from domain.models import AuthorizeInput, VerifiedOperator
    from workflows import options


async def verify_operator(inp: AuthorizeInput) -> VerifiedOperator:
    update = workflow.current_update_info()
    inp = inp.model_copy(update={"update_id": update.id if update else None})
    try:
        return await workflow.execute_activity_method(
            OperatorActivities.authorize_operator, inp, **options.AUTHORIZE,
            summary=f"verify operator {inp.by} ({inp.kind})")
    except ActivityError as e:
        cause = e.cause
        message = cause.message if isinstance(cause, ApplicationError) else str(cause or e)
        kind = cause.type if isinstance(cause, ApplicationError) and cause.type else "NotAuthorized"
        raise ApplicationError(message, type=kind, non_retryable=True) from None
