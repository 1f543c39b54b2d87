"""What an operator asks for: the build request, as the starter makes it and every workflow carries it.

Why apart from ``domain.buildset``: the starter builds and checks a request before it needs the
contract parsers that planning imports (bench/refusal.py); ``domain.buildset`` re-exports these.
"""

from __future__ import annotations

from pydantic import BaseModel, field_validator

from domain.issue_ref import parse_issue_ref

VARIANTS = ("standard", "megatron")


class CompatibilityRequest(BaseModel):
    requested_by: str
    reason: str
    link: str | None = None


class BuildRequest(BaseModel):
    architectures: list[str]
    variants: list[str] = ["standard", "megatron"]
    compatibility_request: CompatibilityRequest | None
    clusters: dict[str, str] = {}  # arch -> cluster override
    priority: str | None = None
    harbor_ref: str | None = None
    push_floating: bool = False
    issue_url: str | None = None
    # --accept-unrehearsed: plan although part of the job could not be rehearsed (recorded per target).
    accept_unrehearsed: bool = False
    # --allow-suspicious-files: bundle files the suspicious-file rule flags (wheels, archives, binaries,
    # files over 5 MiB) after the operator reviewed them; recorded in the request (git-lfs pointers never).
    allow_suspicious_files: bool = False

    @field_validator("issue_url")
    @classmethod
    def _issue_url_names_an_issue(cls, value: str | None) -> str | None:
        """Refused at input time: an unclear value must not silently post nothing after the build."""
        if value is not None and value.strip():
            parse_issue_ref(value)
            return value.strip()
        return None
