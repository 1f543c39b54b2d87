"""Check ``clients/iris.py`` against a controller's protos: the drift test's engine.

The client builds every request from marin-iris's generated classes and parses every reply into them
(``json_format``), so what can drift is the wire between those installed classes (the client's) and the
protos of the controller it talks to. ``check(pool)`` plays a controller whose protos are ``pool`` (the
installed ones, or a modified copy in the tests):

- the client is driven through every public call with every enum value it sends (each priority band,
  existing-job policy, match scope, state filter, GPU and CPU devices);
- each request body is parsed by protobuf's JSON parser against the controller's request message (unknown
  fields and enum names refused);
- each reply is built from the controller's reply message with every field filled, once per value of its
  enums: every job and task state, terminal (exit codes and finish times set, as a controller sets them)
  and not; the client parses it as in production (strictly, recording in ``IrisClient.drift`` what it had
  to ignore);
- every request and reply is walked field by field against both sets of descriptors, so each of a renamed
  or removed field, an enum value one side lacks and a changed scalar type is one problem line, naming the
  message, the field, and whether it was seen in terminal replies, non-terminal replies or requests;
- the job/task state enums of the client are compared with the controller's value for value.

Why walk as well as parse: ``ParseDict`` stops at the first error of a message, and it accepts an int64's
JSON string into a string field (a changed scalar type that parses).
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool

from clients import iris as client_mod
from clients.iris import GpuRequest, IrisClient, LaunchSpec, Resources

PROTO_MODULES = ("iris.rpc.controller_pb2", "iris.rpc.job_pb2", "finelog.rpc.logging_pb2")
JOB_STATE_ENUM = "iris.job.JobState"
TASK_STATE_ENUM = "iris.job.TaskState"
MAX_DEPTH = 4
_TYPE_NAMES = {v: k.removeprefix("TYPE_").lower() for k, v in vars(FieldDescriptor).items()
               if k.startswith("TYPE_") and isinstance(v, int)}
# The states after which a controller sets exit codes and finish times (the client's own terminal sets).
_TERMINAL_NAMES = {f"JOB_STATE_{s.name}" for s in client_mod._TERMINAL_JOB} | {  # noqa: SLF001
    f"TASK_STATE_{s.name}" for s in client_mod._TERMINAL_TASK}  # noqa: SLF001
_SET_ONLY_WHEN_TERMINAL = {"exit_code", "finished_at"}


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


# -- replies of the controller's protos: every field filled, once per enum value -----------------------


def _sample_scalar(f: FieldDescriptor, variant: int):
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
        return values[variant % len(values)].number
    return 7


def _installed_name(desc: Descriptor, f: FieldDescriptor) -> str:
    """The name of field number ``f.number`` in the installed marin-iris (a renamed field is still itself)."""
    try:
        mine = descriptor_pool.Default().FindMessageTypeByName(desc.full_name).fields_by_number.get(f.number)
    except KeyError:
        mine = None
    return mine.name if mine is not None else f.name


def _fill(msg, variant: int, depth: int = 0) -> None:
    """Every field of ``msg`` set; enums to their ``variant``-th value; exit codes and finish times only in a
    message whose state is terminal."""
    desc = msg.DESCRIPTOR
    state = desc.fields_by_name.get("state")
    terminal = (state is not None and state.enum_type is not None
                and state.enum_type.values[variant % len(state.enum_type.values)].name in _TERMINAL_NAMES)
    set_oneofs: set[str] = set()
    for f in desc.fields:
        if state is not None and not terminal and _installed_name(desc, f) in _SET_ONLY_WHEN_TERMINAL:
            continue
        if f.containing_oneof is not None:
            if f.containing_oneof.name in set_oneofs:
                continue
            set_oneofs.add(f.containing_oneof.name)
        target = getattr(msg, f.name) if f.message_type or f.is_repeated else None
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, val_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            key = _sample_scalar(key_f, variant)
            if val_f.message_type is not None:
                if depth < MAX_DEPTH:
                    _fill(target[key], variant, depth + 1)
            else:
                target[key] = _sample_scalar(val_f, variant)
        elif f.is_repeated:
            if f.message_type is not None:
                if depth < MAX_DEPTH:
                    _fill(target.add(), variant, depth + 1)
            else:
                target.append(_sample_scalar(f, variant))
        elif f.message_type is not None:
            if depth < MAX_DEPTH:
                target.SetInParent()
                _fill(target, variant, depth + 1)
        else:
            setattr(msg, f.name, _sample_scalar(f, variant))


def _label(data: dict, desc: Descriptor, inherited: str) -> str:
    """'terminal replies' / 'non-terminal replies' by the message's own state (an omitted state is the zero
    value); a message without a state inherits its parent's label."""
    f = desc.fields_by_name.get("state")
    if f is None or f.enum_type is None:
        return inherited
    state = data.get(f.json_name, data.get(f.name, f.enum_type.values[0].name))
    return "terminal replies" if state in _TERMINAL_NAMES else "non-terminal replies"


def sample_replies(pool: DescriptorPool, full_name: str) -> list[dict]:
    """The reply ``full_name`` as the controller with protos ``pool`` would send it, once per value of the
    largest enum it holds (so every job and task state, terminal and not, comes by)."""
    desc = pool.FindMessageTypeByName(full_name)
    sizes = [len(e.values) for e in _enums_in(desc)]
    out = []
    for variant in range(max(sizes, default=1)):
        msg = message_factory.GetMessageClass(desc)()
        _fill(msg, variant)
        out.append(json_format.MessageToDict(msg))
    return out


def _enums_in(desc: Descriptor, depth: int = 0, seen: set | None = None) -> list[EnumDescriptor]:
    seen = set() if seen is None else seen
    out = []
    for f in desc.fields:
        if f.enum_type is not None and f.enum_type.full_name not in seen:
            seen.add(f.enum_type.full_name)
            out.append(f.enum_type)
        if f.message_type is not None and depth < MAX_DEPTH:
            out.extend(_enums_in(f.message_type, depth + 1, seen))
    return out


# -- the walk: one JSON object against two sets of descriptors ----------------------------------------------


def _field(desc: Descriptor, key: str) -> FieldDescriptor | None:
    return next((f for f in desc.fields if key in (f.json_name, f.name)), None)


def _type(f: FieldDescriptor) -> str:
    name = _TYPE_NAMES.get(f.type, str(f.type))
    if f.message_type is not None:
        name = f"message {f.message_type.full_name}"
    elif f.enum_type is not None:
        name = f"enum {f.enum_type.full_name}"
    return f"repeated {name}" if f.is_repeated and not (
        f.message_type is not None and f.message_type.GetOptions().map_entry) else name


class _Walk:
    """Problems keyed by text, with where each was seen (request / terminal reply / non-terminal reply)."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = defaultdict(set)
        self.sent_enums: dict[str, tuple[EnumDescriptor, EnumDescriptor]] = {}

    def add(self, text: str, where: str) -> None:
        self.seen[text].add(where)

    def walk(self, data: dict, client: Descriptor, controller: Descriptor, where: str, sending: bool,
             depth: int = 0) -> None:
        if not isinstance(data, dict) or depth > MAX_DEPTH + 2:
            return
        if not sending:
            where = _label(data, controller, where)
        for key, value in data.items():
            cf, kf = _field(client, key), _field(controller, key)
            if cf is None or kf is None:
                self._missing(key, cf, kf, client, controller, where, sending)
                continue
            if _type(cf) != _type(kf) and not (cf.message_type and kf.message_type
                                                 and cf.message_type.full_name == kf.message_type.full_name):
                self.add(f"changed scalar type: {client.full_name}.{cf.name} is {_type(cf)} in the client's "
                         f"marin-iris, {_type(kf)} in the controller's protos", where)
                continue
            if cf.message_type is not None and cf.message_type.GetOptions().map_entry:
                cv, kv = cf.message_type.fields_by_name["value"], kf.message_type.fields_by_name["value"]
                if _type(cv) != _type(kv):
                    self.add(f"changed scalar type: {client.full_name}.{cf.name} maps to {_type(cv)} in the "
                             f"client's marin-iris, {_type(kv)} in the controller's protos", where)
                    continue
                for item in (value or {}).values():
                    self._value(item, cv, kv, f"{client.full_name}.{cf.name}", where, sending, depth)
                continue
            for item in value if isinstance(value, list) else [value]:
                self._value(item, cf, kf, f"{client.full_name}.{cf.name}", where, sending, depth)

    def _value(self, item, cf: FieldDescriptor, kf: FieldDescriptor, name: str, where: str, sending: bool,
               depth: int) -> None:
        if cf.message_type is not None:
            self.walk(item, cf.message_type, kf.message_type, where, sending, depth + 1)
        elif cf.enum_type is not None:
            if sending:
                self.sent_enums[cf.enum_type.full_name] = (cf.enum_type, kf.enum_type)
            if isinstance(item, str):
                for side, enum in (("the client's marin-iris", cf.enum_type), ("the controller's protos", kf.enum_type)):
                    if item not in enum.values_by_name:
                        self.add(f"enum value {item} of {enum.full_name} ({name}) is not in {side}", where)

    def _missing(self, key: str, cf, kf, client: Descriptor, controller: Descriptor, where: str,
                 sending: bool) -> None:
        known = cf or kf
        other_desc = controller if cf is not None else client
        other = other_desc.fields_by_number.get(known.number)
        renamed = f" (field {known.number} is {other.name!r} there: renamed)" if other is not None else " (removed)"
        if cf is not None:
            self.add(f"renamed or removed field: the client sends {client.full_name}.{cf.name} ({cf.json_name}), "
                     f"which the controller's {controller.full_name} lacks{renamed}", where)
        else:
            self.add(f"renamed or removed field: the controller sends {controller.full_name}.{kf.name} "
                     f"({kf.json_name}), which the client's {client.full_name} lacks{renamed}", where)


# -- the client, driven through every call --------------------------------------------------------------


def _proxy_prefix() -> str:
    from iris.cluster.endpoints import LOG_SERVER_ENDPOINT_NAME
    from rigging.connect import proxy_path

    return proxy_path(LOG_SERVER_ENDPOINT_NAME)


def _specs() -> list[LaunchSpec]:
    """A LaunchJob request with every option set, once per priority band and existing-job policy the
    client can send, with a GPU and a CPU device, a bundle blob and a bundle id."""
    base = LaunchSpec(
        name="/u/contract", argv=["bash", "-c", "true"], env={"K": "v"}, bundle_blob=b"zip",
        resources=Resources(gpu=GpuRequest(variant="GB200", count=1)), replicas=1, max_retries_failure=3,
        max_retries_preemption=5, timeout_s=60, scheduling_timeout_s=30, priority_band="interactive",
        task_image="img:tag", existing_job_policy="keep", client_revision_date="2026-10-24")
    bands = LaunchSpec.model_fields["priority_band"].annotation.__args__[0].__args__
    policies = LaunchSpec.model_fields["existing_job_policy"].annotation.__args__
    specs = [base.model_copy(update={"priority_band": band}) for band in bands]
    specs += [base.model_copy(update={"existing_job_policy": p}) for p in policies]
    specs.append(base.model_copy(update={"bundle_blob": None, "bundle_id": "sha", "resources": Resources()}))
    return specs


def _calls(client: IrisClient, every_request: bool) -> list[tuple[str, object]]:
    """Every public call; ``every_request``: also once per enum value the client sends (the replies vary
    by round, the requests need one)."""
    specs = _specs() if every_request else _specs()[:1]
    calls: list[tuple[str, object]] = [(f"launch_job({s.priority_band}, {s.existing_job_policy})",
                                        lambda s=s: client.launch_job(s)) for s in specs]
    calls += [
        ("submit_idempotent", lambda: client.submit_idempotent(_specs()[0])),
        ("job_status", lambda: client.job_status("/u/contract")),
        ("job_states", lambda: client.job_states(["/u/contract"])),
        ("list_tasks", lambda: client.list_tasks("/u/contract")),
        ("task_status", lambda: client.task_status("/u/contract/0")),
        ("terminate", lambda: client.terminate("/u/contract")),
        ("fetch_logs(prefix, every option)", lambda: client.fetch_logs(
            "/u/contract/", "prefix", since_ms=5, cursor=3, max_lines=10, tail=True, substring="x",
            min_level="INFO", until_cursor=9)),
        ("fetch_logs(exact)", lambda: client.fetch_logs("/u/contract/0:0", "exact")),
        ("fetch_logs(regex)", lambda: client.fetch_logs("/u/.*", "regex")),
        ("read_complete_log", lambda: client.read_complete_log("/u/contract/", quiet_s=0, poll_s=0, max_wait_s=0)),
        ("cluster_arch_hint", lambda: client.cluster_arch_hint()),
    ]
    calls += [(f"list_jobs(state={s})", lambda s=s: client.list_jobs(prefix="/u/", state=s, limit=2,
                                                                      newest_first=True))
              for s in (client_mod.JobState if every_request else [client_mod.JobState.RUNNING])]
    return calls


def check(pool: DescriptorPool) -> list[str]:
    """Every way ``clients/iris.py`` and a controller with protos ``pool`` disagree (empty: they agree)."""
    problems: list[str] = []
    installed = descriptor_pool.Default()
    walk = _Walk()
    prefix = _proxy_prefix()
    if client_mod.LOG_SERVER_PROXY_PREFIX != prefix:
        problems.append(f"log server proxy path: client uses {client_mod.LOG_SERVER_PROXY_PREFIX!r}, "
                        f"marin-iris proxies /system/log-server at {prefix!r}")
    variant = {"n": 0}
    replies: dict[str, list[dict]] = {}

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
            walk.add(f"{service_name}/{rpc} request ({rpc_desc.input_type.full_name}) refused by the "
                     f"controller's parser: {str(e).splitlines()[0]}", "requests")
        try:
            client_request = installed.FindMessageTypeByName(rpc_desc.input_type.full_name)
        except KeyError:
            problems.append(f"{service_name}/{rpc}: request {rpc_desc.input_type.full_name} is not in the "
                            f"client's marin-iris")
        else:
            walk.walk(body, client_request, rpc_desc.input_type, "requests", sending=True)
        out = replies.setdefault(rpc_desc.output_type.full_name,
                                 sample_replies(pool, rpc_desc.output_type.full_name))
        return out[variant["n"] % len(out)]

    client = IrisClient("http://contract.invalid", client_revision_date="2026-10-24")
    client._post_once = post.__get__(client)  # noqa: SLF001 - every RPC goes through here
    parse = client._parse  # noqa: SLF001

    def walked_parse(method: str, reply: dict, reply_cls):
        try:
            controller_desc = pool.FindMessageTypeByName(reply_cls.DESCRIPTOR.full_name)
        except KeyError:
            problems.append(f"{method}: reply {reply_cls.DESCRIPTOR.full_name} is not in the controller's protos")
        else:
            walk.walk(reply, reply_cls.DESCRIPTOR, controller_desc, "replies", sending=False)
        return parse(method, reply, reply_cls)

    client._parse = walked_parse  # noqa: SLF001

    failures: dict[str, set[str]] = defaultdict(set)

    async def run() -> None:
        try:
            n, rounds = 0, 1
            while n < rounds:  # until every value of the largest enum of any reply came by
                variant["n"] = n
                for label, call in _calls(client, every_request=n == 0):
                    try:
                        await call()
                    except client_mod.NotFound:
                        pass  # a reply without a job: the variant's empty id
                    except Exception as e:  # a reply the client cannot take any more is drift too
                        failures[f"the client failed on a reply built from the protos: {type(e).__name__}: "
                                 f"{e}"].add(label)
                rounds = max((len(r) for r in replies.values()), default=1)
                n += 1
        finally:
            await client.aclose()

    asyncio.run(run())
    for text, labels in sorted(failures.items()):
        problems.append(f"{text} (in {', '.join(sorted(labels))})")
    for text in sorted(client.drift):
        problems.append(f"the client had to ignore part of a reply (IrisClient.drift): {text}")
    for text, where in sorted(walk.seen.items()):
        problems.append(f"{text} [seen in {', '.join(sorted(where))}]")
    for name, (mine, theirs) in sorted(walk.sent_enums.items()):
        for value in mine.values:
            if value.name not in theirs.values_by_name:
                problems.append(f"removed enum value: {value.name} of {name} is in the client's marin-iris, "
                                f"not in the controller's protos")
    problems.extend(_state_enums(pool))
    return problems


def _state_enums(pool: DescriptorPool) -> list[str]:
    """The client's short-name state enums against the controller's, value by value."""
    problems = []
    for enum_name, cls, strip in ((JOB_STATE_ENUM, client_mod.JobState, "JOB_STATE_"),
                                  (TASK_STATE_ENUM, client_mod.TaskState, "TASK_STATE_")):
        try:
            enum = pool.FindEnumTypeByName(enum_name)
        except KeyError:
            problems.append(f"enum {enum_name} is not in the protos")
            continue
        proto_values = {v.name.removeprefix(strip).lower(): v.number for v in enum.values}
        client_values = {m.value for m in cls}
        for short, number in sorted(proto_values.items(), key=lambda kv: kv[1]):
            if short not in client_values:
                problems.append(f"{enum_name}: the controller has {strip}{short.upper()} ({number}), "
                                f"the client's JobState/TaskState does not")
        for short in client_values:
            if short not in proto_values:
                problems.append(f"removed enum value: {enum_name} of the controller lacks {strip}{short.upper()}, "
                                f"which the client maps")
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
