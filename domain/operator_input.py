"""Operator input, validated in one place before anything is submitted (build, schedule, decisions).

Why here and not in click callbacks: ``build`` and ``schedule create`` must accept exactly the same
requests (a schedule that every trigger then refuses is a silent failure), and the workflow-side
validators (approve-merge, decide) apply the same name rule. Every error names the flag.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from pydantic import ValidationError

from domain.request import VARIANTS, BuildRequest, CompatibilityRequest

MAX_NAME = 100  # --requested-by, --by
MAX_TEXT = 2000  # --reason, --note, --link


class OperatorInputError(ValueError):
    """Bad operator input; the message starts with the flag it is about."""


def clean_text(value: str | None, *, flag: str, max_len: int = MAX_TEXT, required: bool = True) -> str | None:
    """Trimmed, valid UTF-8, no control characters, not empty (when required), at most ``max_len``."""
    if value is None:
        if required:
            raise OperatorInputError(f"{flag} is required")
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise OperatorInputError(f"{flag}: not valid UTF-8; pass plain text") from None
    value = value.strip()
    if not value:
        if required:
            raise OperatorInputError(f"{flag} must not be empty or only whitespace")
        return None
    if len(value) > max_len:
        raise OperatorInputError(f"{flag}: {len(value)} characters; at most {max_len} are accepted")
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf") and c not in "\t"), None)
    if bad is not None:
        raise OperatorInputError(f"{flag}: contains the control character U+{ord(bad):04X}; pass plain text")
    return value


def operator_name(value: str | None, *, flag: str) -> str:
    name = clean_text(value, flag=flag, max_len=MAX_NAME)
    assert name is not None
    return name


def cluster_overrides(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for item in items:
        arch, sep, cluster = clean_text(item, flag="--cluster", max_len=MAX_NAME).partition("=")
        if not sep or not arch.strip() or not cluster.strip():
            raise OperatorInputError(f"--cluster {item!r}: expected ARCH=CLUSTER")
        overrides[arch.strip()] = cluster.strip()
    return overrides


def build_request(*, architectures, variants, requested_by, reason, link=None, clusters=(), priority=None,
                  harbor_ref=None, push_floating=False, issue_url=None, accept_unrehearsed=False,
                  allow_suspicious_files=False) -> BuildRequest:
    """The one way a BuildRequest is made from operator input (``build`` and ``schedule create``)."""
    if requested_by is None or reason is None:
        raise OperatorInputError(
            "a compatibility image must be explicitly requested: pass --requested-by and --reason "
            "(maintained Iris training uses the standard task image and must not use this build path)")
    archs = [clean_text(a, flag="--arch", max_len=MAX_NAME) for a in architectures]
    if not archs:
        raise OperatorInputError("--arch is required (e.g. --arch amd64)")
    if len(set(archs)) != len(archs):
        raise OperatorInputError(f"--arch: {', '.join(archs)} names an architecture twice")
    vs = [clean_text(v, flag="--variant", max_len=MAX_NAME) for v in variants]
    try:
        return BuildRequest(
            architectures=archs, variants=vs,
            compatibility_request=CompatibilityRequest(
                requested_by=operator_name(requested_by, flag="--requested-by"),
                reason=clean_text(reason, flag="--reason"),
                link=clean_text(link, flag="--link", required=False)),
            clusters=cluster_overrides(clusters), priority=priority,
            harbor_ref=clean_text(harbor_ref, flag="--harbor-ref", max_len=MAX_NAME, required=False),
            push_floating=push_floating, accept_unrehearsed=accept_unrehearsed,
            allow_suspicious_files=allow_suspicious_files,
            issue_url=clean_text(issue_url, flag="--issue-url", required=False))
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise OperatorInputError(f"invalid build request: {fields}") from None


def check_against_config(request: BuildRequest, clusters: Mapping[str, str | None]) -> None:
    """Refuse what the configuration alone decides, before any repository, Temporal or cluster is asked.

    Each check is one the worker's plan makes against the same configuration (the declared
    architectures before any live one), so a request refused here would be refused there too, only
    after reading both repositories and starting a pipeline. ``clusters``: each configured cluster's
    declared architecture, None where only its controller can tell (then nothing is decided here)."""
    known = ", ".join(sorted(clusters))
    for arch, cluster in request.clusters.items():
        if cluster not in clusters:
            raise OperatorInputError(f"--cluster {arch}={cluster}: cluster {cluster!r} is not configured "
                                     f"(configured: {known})")
    for variant in request.variants:
        if variant not in VARIANTS:
            raise OperatorInputError(f"--variant {variant}: unknown variant {variant!r} (expected one of "
                                     f"{', '.join(VARIANTS)})")
    for arch, cluster in request.clusters.items():
        if arch not in request.architectures:
            raise OperatorInputError(f"--cluster {arch}={cluster}: {arch!r} is not a requested architecture "
                                     f"(--arch {' '.join(request.architectures)})")
    for arch in request.architectures:
        cluster = request.clusters.get(arch)
        if cluster is not None:
            declared = clusters[cluster]
            if declared is not None and declared != arch:
                raise OperatorInputError(f"--cluster {arch}={cluster}: cluster {cluster!r} runs {declared} hosts; "
                                         f"{arch} builds only on a native host")
        elif None not in clusters.values() and arch not in clusters.values():
            runs = ", ".join(f"{name} {declared}" for name, declared in sorted(clusters.items()))
            raise OperatorInputError(f"--arch {arch}: no configured cluster runs {arch} hosts ({runs or 'none'}); "
                                     f"{arch} builds only on a native host")


def request_differences(running: BuildRequest, asked: BuildRequest) -> list[str]:
    """What differs between a running pipeline's request and a new one for the same commits (the
    requester's name and reason do not change the images, so they are not differences)."""
    out = []
    for field in ("architectures", "variants", "clusters", "priority", "harbor_ref", "push_floating", "issue_url",
                  "accept_unrehearsed", "allow_suspicious_files"):
        a, b = getattr(running, field), getattr(asked, field)
        if field in ("architectures", "variants"):
            a, b = sorted(a), sorted(b)
        if a != b:
            out.append(f"{field}: running {a!r}, requested {b!r}")
    return out
