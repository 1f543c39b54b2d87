"""Render the pipeline report as Markdown (for the terminal, the PR body and the issue comment).

Upstream and operator text goes through ``inert``: ``inert_markdown`` (HTML-escaped, references broken with
zero-width spaces) where GitHub renders it, ``terminal_text.plain_line`` where a terminal shows it (no
``-&gt;`` for ``->``)."""

from __future__ import annotations

from domain.buildset import TargetSpec
from domain.models import FileRef, PipelineReport, TargetResult
from domain.outcome import is_cancelled, waiting_line
from domain.render import inert_markdown


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def evidence_ref(ref: FileRef) -> str:
    """An evidence file as reports show it: store URI and digest (never a worker-local path)."""
    return f"`{ref.uri}` (sha256 `{ref.sha256[:16]}…`, {_fmt_bytes(ref.size_bytes)})"


def evidence_lines(targets: list[TargetResult]) -> list[str]:
    """One line per evidence file: build logs and the diagnostics of every failed round."""
    out = []
    for t in targets:
        if t.log_check:
            out.append(f"- {t.key} build log: {evidence_ref(t.log_check.log)}")
        for f in t.failures:
            if f.diagnostics:
                out.append(f"- {t.key} `{f.job_id}` {f.failure_class} diagnostics: {evidence_ref(f.diagnostics)}")
    return out


def log_evidence_lines(key: str, check, inert=inert_markdown) -> list[str]:
    """A build log that was not complete evidence: why, and which image evidence stood in for what."""
    if not check.incomplete:
        return []
    out = [f"- {key} build log incomplete: {'; '.join(check.incomplete)}"]
    out += [f"  - {inert(m)}: proven by {how}" for m, how in check.stood_in.items()]
    out += [f"  - {inert(m)}: " + (inert(check.unproven[m]) if m in check.unproven else "proven by nothing (log_lost)")
            for m in check.missing if check.lost]
    return out


def target_rows(targets: list[TargetResult]) -> list[str]:
    rows = ["| target | status | jobs | tag | digest | platform | layers (largest) | anonymous pull | labels |",
            "|---|---|---|---|---|---|---|---|---|"]
    for t in targets:
        v = t.validation
        labels = "ok" if v and all(c.verdict == "pass" for c in v.checks if c.name.startswith("label")) else "-"
        status = f"{t.status} (adopted, no new job)" if t.adopted_from else t.status
        rows.append(
            f"| {t.key} | {status} | {', '.join(f'`{j}`' for j in t.job_ids) or '-'} | `{t.tag}` | "
            f"`{t.digest or '-'}` | {t.platform or '-'} | "
            f"{(v.layer_count if v else '-')} ({_fmt_bytes(v.largest_layer_bytes) if v else '-'}) | "
            f"{(v.anonymous_pull if v else '-')} | {labels} |")
    return rows


def _plan_value(t: TargetSpec, field: str) -> str:
    j, r = t.job, t.job.resources
    c = t.layer_ceiling
    simple = {
        "cluster": j.cluster, "priority": j.priority, "resources.cpu": f"{r.cpu:g}",
        "resources.memory": _fmt_bytes(r.memory_bytes), "resources.disk": _fmt_bytes(r.disk_bytes),
        "resources.gpu": r.gpu or "none", "max_retries": str(j.max_retries_failure), "timeout": f"{j.timeout_s} s",
        "task_image": j.task_image or "-", "no_sync": str(j.no_sync),
        "enable_extra_resources": str(j.enable_extra_resources), "command": " ".join(j.command)[:60], "job_name": j.job_name,
        "dockerfile": t.dockerfile, "image_repository": t.image_repository, "tag": t.tag,
        "architecture": t.architecture, "variant": t.variant, "script_env_var": j.script_env_var or "-",
        "kaniko_platform": t.kaniko_platform, "max_retries_preemption": str(j.max_retries_preemption),
        "floating_tag": t.floating_tag or "-", "cache_repo": t.cache_repo or "-",
        "wheel_source": t.wheel_source, "markers": f"{len(t.expected_markers)} markers",
        "layer_ceiling.max_layer_bytes": f"{c.max_layer_bytes / 1e9:g} GB" if c else "-",
        "layer_ceiling.warn_layer_bytes": f"{c.warn_layer_bytes / 1e9:g} GB" if c else "-",
        "layer_ceiling.min_layers": str(c.min_layers) if c else "-",
    }
    if field in simple:
        return simple[field]
    if field.startswith("env."):
        e = next((e for e in j.env if e.name == field[4:]), None)
        if e is None:
            return "-"
        return f"<secret:{e.secret}>" if e.secret else ("<build script>" if e.name == j.script_env_var
                                                          else (e.value or ""))
    return "-"


def provenance_rows(t: TargetSpec) -> list[str]:
    """Where each planned value of one target came from (`file:line` at ``t.lines_at`` or `config:<key>`)."""
    at = f" (file:line at `{t.lines_at[:12]}`)" if t.lines_at else ""
    rows = [f"`{t.key}` — where each value comes from{at}:", "", "| field | value | from |", "|---|---|---|"]
    for field, source in t.provenance.items():
        value = _plan_value(t, field).replace("|", "\\|")
        rows.append(f"| {field} | `{value}` | {source} |")
    return rows


def report_markdown(rep: PipelineReport, *, inert=inert_markdown) -> str:
    out = [f"# GPU-RL build `{rep.workflow_id}` — {rep.status}", ""]
    if rep.failure:
        f = rep.failure
        out += [f"**{'Cancelled' if is_cancelled(f) else 'Failed'}** ({f.failure_class}, "
                f"{f.error_type}" + (f", `{f.location}`" if f.location else "") + f"): {f.message}", "",
                f"**Next step:** {f.next_step}", ""]
    elif rep.message:
        out += [rep.message, ""]
    for w in rep.waiting:
        out += [f"**Waiting** — {waiting_line(w)}", ""]
    if rep.workflow_url:
        out += [f"Temporal: {rep.workflow_url}", ""]
    req = rep.request
    if req.compatibility_request:
        cr = req.compatibility_request
        out += [f"Requested by **{cr.requested_by}**: {cr.reason}" + (f" ({cr.link})" if cr.link else ""), ""]
    if rep.source:
        s = rep.source
        out += [f"- source commit: `{s.build_commit}` (branch `{s.branch}`, base `{s.base_commit[:12]}`,"
                f" {'new commit' if s.created_commit else 'no source change needed'})",
                f"- Harbor commit: `{s.harbor_commit}`",
                f"- Iris bundle: {_fmt_bytes(s.bundle.size_bytes)} in {s.bundle.file_count} files "
                f"(sha256 `{s.bundle.sha256[:16]}…`)"]
        if s.harbor_diff:
            out.append(f"- Harbor dependency diff `{s.harbor_diff.old[:12]}`..`{s.harbor_diff.new[:12]}`"
                       f" ({'affects the image' if s.harbor_diff.affects_image else 'no image-relevant change'}):")
            out += [f"  - {inert(line)}" for line in s.harbor_diff.lines] or ["  - no dependency change"]
        if s.ops_doc_corrected:
            out.append("- stale ops documentation corrected in the same commit"
                       + (f" (file:line at base `{s.base_commit[:12]}`):" if s.ops_corrections else ""))
            out += [f"  - {inert_markdown(c)}" for c in s.ops_corrections]
        if s.digests_in:
            out.append(f"- digests go in: {'the pin table `' + (s.pin_table or '') + '`' if s.digests_in == 'pin_table' else 'the PR body and the issue (no pin table)'}"
                       + (f" — {s.pin_target_reason}" if s.pin_target_reason else ""))
        out.append("")
    if rep.state and rep.state.disagreements:
        at = f", file:line at `{rep.state.base_commit[:12]}`" if rep.state.base_commit else ""
        out += [f"Contract disagreements (the script wins over prose; prose over configuration{at}):"]
        out += [f"- {d}" for d in rep.state.disagreements] + [""]
    if rep.state and rep.state.fallbacks:
        out += ["Taken from configuration (the ops doc / AGENTS.md does not state it):"]
        out += [f"- {f}" for f in rep.state.fallbacks] + [""]
    if rep.plan and not rep.targets:
        out += ["| target | cluster | job name | tag | wheel source | priority | resources |",
                "|---|---|---|---|---|---|---|"]
        for t in rep.plan:
            r = t.job.resources
            res = f"cpu {r.cpu:g}, mem {_fmt_bytes(r.memory_bytes)}, disk {_fmt_bytes(r.disk_bytes)}" + (
                f", gpu {r.gpu}" if r.gpu else "")
            out.append(f"| {t.key} | {t.cluster} | `{t.job.job_name}` | `{t.tag}` | {t.wheel_source} | "
                       f"{t.job.priority} | {res} |")
        out.append("")
        for t in rep.plan:
            env = ", ".join(f"{e.name}={'<secret:' + e.secret + '>' if e.secret else e.value}"
                            for e in t.job.env if e.name != t.job.script_env_var)
            via = (f"script via `{t.job.script_env_var}` from `{t.job.script_path}`" if t.job.script_env_var
                   else f"runs `{t.job.script_path}` from the bundle")
            out.append(f"- `{t.key}` env: {env}; {via}")
        out.append("")
        out += [f"- `{t.key}` {t.rehearsal.describe()}" for t in rep.plan if t.rehearsal] + [""]
        for t in rep.plan:
            out += provenance_rows(t) + [""]
    if rep.targets:
        out += target_rows(rep.targets) + [""]
        adopted = [t for t in rep.targets if t.adopted_from]
        if adopted:
            out += [f"Adopted from an earlier run (validated image still at its tag, evidence in the store; "
                    f"not rebuilt): {', '.join(f'{t.key} ({t.adopted_from})' for t in adopted)}", ""]
        for t in rep.targets:
            for f in t.failures:
                out.append(f"- {t.key}: `{f.job_id}` {f.failure_class} → {f.decision}"
                           + (f": `{f.failing_line}`" if f.failing_line else "")
                           + (f" — {f.reasons[0]}" if f.reasons and f.failure_class in ("unknown", "log_lost", "cache_unproven")
                              else "")
                           + (f" (evidence {evidence_ref(f.diagnostics)})" if f.diagnostics else ""))
        out += [f"- {t.key} build log: {evidence_ref(t.log_check.log)}" for t in rep.targets if t.log_check]
        out += [line for t in rep.targets if t.log_check for line in log_evidence_lines(t.key, t.log_check, inert)]
        out.append("")
        # What the planned command proved before it was submitted (or why it was not rehearsed).
        rehearsed = [f"- `{t.key}` {t.rehearsal.describe()}" for t in rep.plan if t.rehearsal]
        if rehearsed:
            out += rehearsed + [""]
        if any(t.provenance for t in rep.plan):  # collapsed in the PR body; plain text in a terminal
            out += ["<details><summary>Where each planned value came from</summary>", ""]
            for t in rep.plan:
                out += provenance_rows(t) + [""]
            out += ["</details>", ""]
    if rep.pull_request:
        pr = rep.pull_request
        out.append(f"PR: {pr.url} (#{pr.number}, head `{pr.head_sha[:12]}`)")
    if auth := rep.merge_authorization:
        out.append(f"Merge authorized by {auth.by} ({auth.via}"
                   + (f"; {auth.verified}" if auth.verified else "")
                   + (f"; Temporal identity {auth.temporal_identity}" if auth.temporal_identity else "")
                   + ")" + (f"; overridden: {', '.join(auth.override_checks)} — "
                            f"{auth.reason}" if auth.override_checks else ""))
    if rep.merge_commit:
        out.append(f"Merge commit: `{rep.merge_commit}`")
    return "\n".join(out).rstrip() + "\n"
