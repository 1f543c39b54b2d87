"""How fast the PR watch may poll GitHub, given what the last answer said about the rate limit. Pure.

Why: a token's REST budget (5,000 requests an hour for a user token) is shared by every PR watch, the
merge, the comments and whatever else the token does. With conditional requests an idle PR costs almost
nothing, but a busy one (CI reporting, reviews) still does; when the budget runs low the watch spreads
what is left over the time until the limit resets, instead of spending it and failing on 403s.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

LOW_FRACTION = 0.2  # below this share of the limit left, the watch paces itself
RESERVE_FRACTION = 0.05  # never planned for the watch: kept for the merge, comments, other steps
MAX_INTERVAL_S = 600.0  # at least one look every 10 minutes, even with the budget spent


class Pace(BaseModel):
    interval_s: float
    reason: str | None = None  # set when slower than the configured cadence: logged and heartbeated


def watch_pace(base_s: float, *, limit: int | None, remaining: int | None, reset_at: datetime | None,
               cost: int, now: datetime) -> Pace:
    """The wait before the next round of reads.

    ``cost``: how many answers of the last round counted against the limit (304s do not); at least one
    round's worth is planned for. Unknown headers (another GitHub, a proxy) leave the cadence alone."""
    if limit is None or remaining is None or reset_at is None or limit <= 0 or remaining > limit * LOW_FRACTION:
        return Pace(interval_s=base_s)
    reset_in = max(1.0, (reset_at - now).total_seconds())
    per_round = max(1, cost)
    spendable = remaining - limit * RESERVE_FRACTION
    interval = reset_in + 1.0 if spendable < per_round else reset_in * per_round / spendable
    interval = min(max(base_s, interval), max(base_s, MAX_INTERVAL_S))
    if interval <= base_s:
        return Pace(interval_s=base_s)
    return Pace(interval_s=interval, reason=(
        f"GitHub rate limit low: {remaining} of {limit} requests left until {reset_at:%H:%M:%S}Z; "
        f"watching every {interval:.0f} s instead of {base_s:g} s"))
