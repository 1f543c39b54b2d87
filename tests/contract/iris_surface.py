"""Check ``clients/iris.py`` against marin-iris's own protos: the drift test's engine.

Why derived from behaviour, not from a hand-kept list: the client is driven through every public call
with every option set, each request body it sends is parsed by protobuf's own JSON parser
(``json_format.ParseDict``, unknown fields and enum names refused) against the request message of
the RPC its path names, and every reply key it reads is recorded on replies built from the reply
message (every field filled, serialized by ``json_format.MessageToDict`` as a controller would).
A key the client reads that the message lacks, a path whose service or RPC is gone, a field it sends
that the request lacks, a state enum value it does not know: each is one problem line.

``check(pool)`` takes a descriptor pool, so a test can point it at a modified copy of the protos.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable

from google.protobuf import descriptor_pb2, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool

from clients import iris as client_mod
from clients.iris import GpuRequest, IrisClient, LaunchSpec, Resources

PROTO_MODULES = ("iris.rpc.controller_pb2", "iris.rpc.job_pb2", "finelog.rpc.logging_pb2")
JOB_STATE_ENUM = "iris.job.JobState"
TASK_STATE_ENUM = "iris.job.TaskState"
MAX_DEPTH = 4


def installed_files() -> list[descriptor_pb2.FileDescriptorProto]:
    """The installed marin-iris/finelog proto files the client talks to, with every dependency,
    dependencies first (the order a fresh pool needs)."""
    import importlib

    seen: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def visit(fd) -> None:
        if fd.name in seen:
            return
        for dep in fd.dependencies:
            visit(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        seen[fd.name] = proto

    for name in PROTO_MODULES:
        visit(importlib.import_module(name).DESCRIPTOR)
    return list(seen.values())


def pool_of(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> DescriptorPool:
    pool = DescriptorPool()
    for f in files:
        pool.Add(f)
    return pool


def installed_pool() -> DescriptorPool:
    return pool_of(installed_files())


# -- replies: every field filled, reads recorded ------------------------------------------------------


def _sample_scalar(f: FieldDescriptor):
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return f"s-{f.name}"
    if t == FieldDescriptor.TYPE_BYTES:
        return b"x"
    if t == FieldDescriptor.TYPE_BOOL:
        return True
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 1.5
    if t == FieldDescriptor.TYPE_ENUM:
        values = f.enum_type.values
        return values[1].number if len(values) > 1 else values[0].number
    return 7


def _fill(msg, depth: int = 0) -> None:
    set_oneofs: set[str] = set()
    for f in msg.DESCRIPTOR.fields:
        if f.containing_oneof is not None:
            if f.containing_oneof.name in set_oneofs:
                continue
            set_oneofs.add(f.containing_oneof.name)
        target = getattr(msg, f.name) if f.message_type or f.is_repeated else None
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, val_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            key = _sample_scalar(key_f)
            if val_f.message_type is not None:
                if depth < MAX_DEPTH:
                    _fill(target[key], depth + 1)
            else:
                target[key] = _sample_scalar(val_f)
        elif f.is_repeated:
            if f.message_type is not None:
                if depth < MAX_DEPTH:
                    _fill(target.add(), depth + 1)
            else:
                target.append(_sample_scalar(f))
        elif f.message_type is not None:
            if depth < MAX_DEPTH:
                target.SetInParent()
                _fill(target, depth + 1)
        else:
            setattr(msg, f.name, _sample_scalar(f))


class _Tracked(dict):
    """A reply object that records which keys the client reads, per message type."""

    def __init__(self, data: dict, desc: Descriptor, reads: set):
        super().__init__(data)
        self._desc, self._reads = desc, reads

    def _note(self, key) -> None:
        self._reads.add((self._desc.full_name, key))

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._note(key)
        return super().__contains__(key)


def _field(desc: Descriptor, key: str) -> FieldDescriptor | None:
    return next((f for f in desc.fields if key in (f.json_name, f.name)), None)


def _wrap(data, desc: Descriptor, reads: set):
    out = {}
    for key, value in data.items():
        f = _field(desc, key)
        if f is not None and f.message_type is not None:
            if f.message_type.GetOptions().map_entry:
                val_f = f.message_type.fields_by_name["value"]
                if val_f.message_type is not None:
                    value = {k: _wrap(v, val_f.message_type, reads) for k, v in value.items()}
            elif isinstance(value, list):
                value = [_wrap(v, f.message_type, reads) for v in value]
            else:
                value = _wrap(value, f.message_type, reads)
        out[key] = value
    return _Tracked(out, desc, reads)


def sample_reply(pool: DescriptorPool, full_name: str, reads: set) -> dict:
    desc = pool.FindMessageTypeByName(full_name)
    msg = message_factory.GetMessageClass(desc)()
    _fill(msg)
    return _wrap(json_format.MessageToDict(msg), desc, reads)


# -- the client, driven through every call --------------------------------------------------------------


def _proxy_prefix() -> str:
    from iris.cluster.endpoints import LOG_SERVER_ENDPOINT_NAME
    from rigging.connect import proxy_path

    return proxy_path(LOG_SERVER_ENDPOINT_NAME)


def _full_spec() -> LaunchSpec:
    return LaunchSpec(
        name="/u/contract", argv=["bash", "-c", "true"], env={"K": "v"}, bundle_blob=b"zip",
        resources=Resources(gpu=GpuRequest(variant="GB200", count=1)), replicas=1, max_retries_failure=3,
        max_retries_preemption=5, timeout_s=60, scheduling_timeout_s=30, priority_band="batch",
        task_image="img:tag", existing_job_policy="keep", client_revision_date="2026-10-24")


async def _drive(client: IrisClient) -> None:
    spec = _full_spec()
    await client.launch_job(spec)
    await client.launch_job(spec.model_copy(update={"bundle_blob": None, "bundle_id": "sha",
                                                    "resources": Resources()}))
    await client.submit_idempotent(spec)
    await client.job_status("/u/contract")
    await client.job_states(["/u/contract"])
    await client.list_jobs(prefix="/u/", state="running", limit=2, newest_first=True)
    await client.list_tasks("/u/contract")
    await client.task_status("/u/contract/0")
    await client.terminate("/u/contract")
    await client.fetch_logs("/u/contract/", "prefix", since_ms=5, cursor=3, max_lines=10, tail=True,
                            substring="x", min_level="INFO")
    await client.fetch_logs("/u/contract/0:0", "exact")
    await client.fetch_logs("/u/.*", "regex")
    await client.read_complete_log("/u/contract/", quiet_s=0, poll_s=0, max_wait_s=0)
    await client.cluster_arch_hint()


def check(pool: DescriptorPool) -> list[str]:
    """Every way ``clients/iris.py`` disagrees with the protos in ``pool`` (empty: it agrees)."""
    problems: list[str] = []
    reads: set = set()
    prefix = _proxy_prefix()
    if client_mod.LOG_SERVER_PROXY_PREFIX != prefix:
        problems.append(f"log server proxy path: client uses {client_mod.LOG_SERVER_PROXY_PREFIX!r}, "
                        f"marin-iris proxies /system/log-server at {prefix!r}")

    async def post(self, path: str, method: str, body: dict, timeout_s, secrets=()) -> dict:
        rest = path.removeprefix(client_mod.LOG_SERVER_PROXY_PREFIX)
        m = re.fullmatch(r"/([\w.]+)/(\w+)", rest)
        if not m:
            problems.append(f"{path}: not a Connect path /<package.Service>/<Method>")
            return {}
        service_name, rpc = m.groups()
        try:
            service = pool.FindServiceByName(service_name)
        except KeyError:
            problems.append(f"{path}: service {service_name} is not in the protos")
            return {}
        rpc_desc = service.methods_by_name.get(rpc)
        if rpc_desc is None:
            problems.append(f"{path}: {service_name} has no RPC {rpc} "
                            f"(it has {', '.join(sorted(service.methods_by_name))})")
            return {}
        request_cls = message_factory.GetMessageClass(rpc_desc.input_type)
        try:
            json_format.ParseDict(body, request_cls(), descriptor_pool=pool)
        except json_format.ParseError as e:
            problems.append(f"{service_name}/{rpc} request ({rpc_desc.input_type.full_name}): {e}")
        return sample_reply(pool, rpc_desc.output_type.full_name, reads)

    client = IrisClient("http://contract.invalid", client_revision_date="2026-10-24")
    client._post_once = post.__get__(client)  # noqa: SLF001 - every RPC goes through here

    async def run() -> None:
        try:
            await _drive(client)
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    except Exception as e:  # a reply the client cannot parse any more is drift too
        problems.append(f"the client failed on a reply built from the protos: {type(e).__name__}: {e}")

    for msg_name, key in sorted(reads):
        desc = pool.FindMessageTypeByName(msg_name)
        if _field(desc, key) is None:
            problems.append(f"the client reads {key!r} of {msg_name}, which has no such field "
                            f"(fields: {', '.join(f.json_name for f in desc.fields)})")

    for enum_name, cls, strip in ((JOB_STATE_ENUM, client_mod.JobState, "JOB_STATE_"),
                                  (TASK_STATE_ENUM, client_mod.TaskState, "TASK_STATE_")):
        try:
            enum = pool.FindEnumTypeByName(enum_name)
        except KeyError:
            problems.append(f"enum {enum_name} is not in the protos")
            continue
        proto_values = {v.name.removeprefix(strip).lower(): v.number for v in enum.values}
        client_values = {m.value: i for i, m in enumerate(cls)}
        if proto_values != client_values:
            problems.append(f"{enum_name}: protos have {sorted(proto_values.items(), key=lambda kv: kv[1])}, "
                            f"the client {sorted(client_values.items(), key=lambda kv: kv[1])}")
    return problems


def main() -> int:
    """``python -m tests.contract.iris_surface``: the installed marin-iris, the client's pin, and every
    disagreement between the client and the installed protos (exit 1 if any)."""
    from importlib.metadata import version

    from iris import version as iris_version

    from clients.iris_pin import IRIS_REVISION_DATE, IRIS_VERSION

    installed = version("marin-iris")
    build_date = iris_version.BUILD_DATE or iris_version.client_revision_date()
    print(f"installed marin-iris {installed} (build date {build_date}); "
          f"clients/iris_pin.py: {IRIS_VERSION} ({IRIS_REVISION_DATE})")
    problems = check(installed_pool())
    if (installed, build_date) != (IRIS_VERSION, IRIS_REVISION_DATE):
        problems.append(f"clients/iris_pin.py: set IRIS_VERSION = {installed!r}, "
                        f"IRIS_REVISION_DATE = {build_date!r}")
    for p in problems:
        print(f"- {p}")
    print("the client agrees with the installed marin-iris" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
