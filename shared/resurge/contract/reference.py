"""The events reference (``docs/events.md``) and its AsyncAPI 3.0 document
(``docs/asyncapi.yaml``), generated from the event models' JSON Schemas.

Contract:

- Input: the JSON document ``resurge schema`` prints, ``{name: JSON Schema}`` with one
  entry per event kind (an object schema whose ``kind`` property is a ``const``) and
  others (``event``, the union; ``TrainingJob``) that are not kinds and are left out.
  The schemas are taken as an argument rather than imported: this module lives in the
  contract layer, below the event models, and imports only the standard library,
  ``yaml`` and :mod:`resurge.contract`.
- Subjects: every family's address is built by :class:`~resurge.contract.subjects.Subjects`
  (default namespace ``resurge``), its wildcards named after the builder's arguments.
  Which kinds travel on which family is :mod:`resurge.contract.families`' table; a kind
  the schemas hold and no family lists, or the other way round, raises
  :class:`ValueError`, so a new event kind cannot be left out of the reference.
- Readers: who reads each family, and the table of every service's subscriptions, come
  from the declarations of :mod:`resurge.contract.subscriptions`.
- Output: :func:`events_markdown` (Markdown) and :func:`asyncapi_document` (a dict of
  JSON types; :func:`asyncapi_yaml` is its YAML text) depend only on their input: the
  same schemas give the same bytes, so a test can hold the committed files to them.
- ``python -m resurge.contract.reference events|asyncapi [PATH]`` reads the schema
  document on stdin and writes one output to ``PATH`` (or stdout); ``make schemas``
  runs it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from resurge.contract.families import RAW_JOB_KINDS, RAW_NODE_KINDS, STREAMS
from resurge.contract.families import family as stream_family
from resurge.contract.subjects import NODE_LEVEL_JOB, Subjects
from resurge.contract.subscriptions import SUBSCRIPTIONS, Reader, Scope
from resurge.contract.vocabulary import FaultScope

__all__ = [
    "FAMILIES",
    "Family",
    "Parameter",
    "asyncapi_document",
    "asyncapi_yaml",
    "event_kinds",
    "events_markdown",
    "main",
]

Schema = Mapping[str, Any]

REGENERATE = "make schemas"
_HEADER = (
    "Generated from the event models' JSON Schemas by `resurge.contract.reference` "
    f"(`{REGENERATE}`): do not edit."
)
_SUBJECTS = Subjects()
_TRAINING_JOB = "TrainingJob"
_KIND = re.compile(r"^[a-z0-9_]{1,64}$")  # event kinds are fixed subject tokens


@dataclass(frozen=True)
class Parameter:
    """One wildcard token of a subject family, as the AsyncAPI channel names it."""

    name: str
    description: str
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """A subject family: its subjects, its JetStream stream, and the kinds it carries."""

    name: str
    summary: str
    publishers: str
    parameters: tuple[Parameter, ...]
    build: Callable[[Subjects], str]
    note: str = ""
    other_readers: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds the family carries (:mod:`resurge.contract.families`)."""
        return stream_family(self.name).kinds

    @property
    def subscribers(self) -> str:
        """Who reads the family: the services that declare a subscription to it, with
        the kinds each takes, then the readers outside the services."""
        readers = [r for r in (_service_readers(self.name), self.other_readers) if r]
        return "; ".join(readers) or "nobody in resurge"

    @property
    def address(self) -> str:
        """The subject with each wildcard replaced by ``{parameter}``, in order."""
        tokens = self.build(_SUBJECTS).split(".")
        names = iter(p.name for p in self.parameters)
        address = ".".join(f"{{{next(names)}}}" if t == "*" else t for t in tokens)
        if next(names, None) is not None:
            raise ValueError(f"family {self.name}: more parameters than wildcards")
        return address

    @property
    def stream(self) -> str:
        """The JetStream stream that stores the family (default namespace; the raw
        family's telemetry stream, see :attr:`streams`)."""
        return _SUBJECTS.stream(self.name)

    @property
    def streams(self) -> list[str]:
        """Every stream that stores some of the family's kinds (default namespace)."""
        return [_SUBJECTS.stream(one.name) for one in STREAMS if one.family == self.name]

    @property
    def stored(self) -> str:
        """In words (markdown): the streams that store the family, and what each holds."""
        parts = [one for one in STREAMS if one.family == self.name]
        if len(parts) == 1:
            return f"`{self.stream}` (subjects `{_SUBJECTS.all(self.name)}`)"
        return "; ".join(
            f"`{_SUBJECTS.stream(one.name)}` ({', '.join(f'`{k}`' for k in one.kinds)})"
            for one in parts
        )


_JOB = Parameter(
    "job",
    "The job's name as one token (names holding characters other than letters, digits "
    "and `-` are escaped: `_` is doubled, any other character becomes `_xx` per UTF-8 "
    "byte).",
)
_NODE = Parameter("node", "The node's name, escaped as one token like the job's.")
_RAW_JOB_KINDS = RAW_JOB_KINDS
_RAW_NODE_KINDS = RAW_NODE_KINDS
_SERVICE_NAMES = {"node-agent": "launch agents", "node-monitor": "node monitors"}


def _service_readers(family_name: str) -> str:
    """``the restarter (`a`, `b`); the scaler`` for the services reading a family."""
    kinds: dict[str, list[str]] = {}
    for entry in SUBSCRIPTIONS:
        if entry.family == family_name:
            taken = kinds.setdefault(entry.service, [])
            taken += [k for k in entry.kinds if k not in taken]
    carried = set(stream_family(family_name).kinds)
    some = any(set(taken) != carried for taken in kinds.values())
    parts = []
    for service, taken in kinds.items():
        name = _SERVICE_NAMES.get(service, f"the {service}")
        if set(taken) == carried:
            parts.append(f"{name} (every kind)" if some else name)
        else:
            parts.append(f"{name} ({', '.join(f'`{k}`' for k in taken)})")
    return "; ".join(parts)


FAMILIES: tuple[Family, ...] = (
    Family(
        name="raw",
        summary="Node-agent telemetry: what workers, agents and GPUs did.",
        publishers="node agents: `launch` (one replica's workers) and `monitor` (one node)",
        parameters=(
            Parameter(
                "job",
                f"The job's name as one token, escaped; `{NODE_LEVEL_JOB}` for node-level "
                f"events ({', '.join(f'`{k}`' for k in _RAW_NODE_KINDS)}).",
            ),
            Parameter("kind", "The event kind.", _RAW_JOB_KINDS + _RAW_NODE_KINDS),
            _NODE,
        ),
        build=lambda s: s.raw(None, None, None),
        note="The fault-grade kinds (a worker's exit, its fault report, an agent's state, "
        "a GPU error) are stored in a stream of their own, apart from the telemetry, so a "
        "backlog of telemetry never queues in front of them; the subjects are the same. "
        "Both raw streams keep their events for a short time (an hour by default, "
        "`RESURGE_RAW_MAX_AGE_SECONDS`); the other streams a day "
        "(`RESURGE_STREAM_MAX_AGE_SECONDS`).",
    ),
    Family(
        name="fault",
        summary="Faults the detector found, by how far they reach.",
        publishers="the detector",
        parameters=(
            _JOB,
            Parameter(
                "scope",
                "How far the fault reaches.",
                tuple(scope.value for scope in FaultScope),
            ),
        ),
        build=lambda s: s.fault(None, None),
    ),
    Family(
        name="capacity",
        summary="One node's capacity as it changes: its slots, the free ones, its health.",
        publishers="the detector (node health), `resurge node` commands, the Kubernetes "
        "backend's node watch",
        parameters=(_NODE,),
        build=lambda s: s.capacity(None),
    ),
    Family(
        name="cmd",
        summary="Commands to one replica's agent, or (job token "
        f"`{NODE_LEVEL_JOB}`) to one node's monitor agent.",
        publishers="the restarter and the scaler (`assign`, `stop`, `checkpoint_now`); "
        "`resurge inject` (`inject_fault`, `inject_gpu_error`); `resurge node uncordon` "
        "(`repair_node`)",
        parameters=(
            Parameter(
                "job",
                f"The job's name as one token, escaped; `{NODE_LEVEL_JOB}` for commands to "
                "a node's monitor agent (`inject_gpu_error`, `repair_node`).",
            ),
            Parameter(
                "replica",
                "The replica's index (0, 1, ...); for commands to a monitor agent, the "
                "node's name as one token.",
            ),
        ),
        build=lambda s: s.cmd(None, None),
    ),
    Family(
        name="action",
        summary="What the control plane did to a job: recoveries begun and ended, "
        "resizes, phase changes.",
        publishers="the restarter (`recovery_started`, `recovery_finished`), the scaler "
        "(`scale_decided`), and both when they move a job's phase (`phase_changed`)",
        parameters=(_JOB,),
        build=lambda s: s.action(None),
        other_readers="`resurge events`, `resurge status`, `resurge report`",
    ),
    Family(
        name="job",
        summary="The life of a job: submitted, deleted, a replica finished.",
        publishers="`resurge submit` and `resurge delete` (local), the Kubernetes "
        "controller (from TrainingJob resources), the detector (`replica_finished`)",
        parameters=(_JOB,),
        build=lambda s: s.job(None),
    ),
    Family(
        name="dlq",
        summary="Messages a service could not decode or handle, with the reason.",
        publishers="every service, for what it received",
        parameters=(Parameter("service", "The service that could not read the message."),),
        build=lambda s: s.dlq(None),
        other_readers="people and tools that watch for bad input",
    ),
)


def event_kinds(schemas: Mapping[str, Schema]) -> dict[str, Schema]:
    """The schemas of event kinds only, by kind, in name order: those whose ``kind`` is a
    constant equal to their name, in lower case (the TrainingJob's ``kind`` is not).
    Keys are sorted at every depth, as ``resurge schema`` prints them, so the output does
    not depend on how the input was ordered."""
    schemas = json.loads(json.dumps(schemas, sort_keys=True))  # the same, however ordered
    kinds: dict[str, Schema] = {}
    for name in sorted(schemas):
        kind = schemas[name].get("properties", {}).get("kind", {})
        if isinstance(kind, Mapping) and kind.get("const") == name and _KIND.fullmatch(name):
            kinds[name] = schemas[name]
    return kinds


def _check(kinds: Mapping[str, Schema]) -> None:
    listed = [k for family in FAMILIES for k in family.kinds]
    if len(listed) != len(set(listed)):
        raise ValueError("a kind is listed under two subject families")
    missing = sorted(set(kinds) - set(listed))
    unknown = sorted(set(listed) - set(kinds))
    if missing or unknown:
        raise ValueError(
            f"subject families and event schemas disagree: no family for {missing}, "
            f"no schema for {unknown}"
        )


# ---- Markdown ------------------------------------------------------------------------


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type_of(prop: Schema) -> str:
    """A field's type in a few words; ``$ref`` targets are named and linked."""
    if "$ref" in prop:
        name = _ref_name(prop["$ref"])
        return f"[{name}]({'jobspec.md' if name == _TRAINING_JOB else '#' + name.lower()})"
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        text = " or ".join(_type_of(o) for o in options)
        return f"{text} or null" if len(options) < len(prop["anyOf"]) else text
    kind = prop.get("type", "any")
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    if kind == "array":
        return f"list of {_type_of(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop:
        values = prop["additionalProperties"]
        return "object" if values is True else f"map of string to {_type_of(values)}"
    bounds = [f"≥ {prop['minimum']}"] if "minimum" in prop else []
    bounds += [f"> {prop['exclusiveMinimum']}"] if "exclusiveMinimum" in prop else []
    bounds += [f"≤ {prop['maximum']}"] if "maximum" in prop else []
    return " ".join([str(kind), *bounds])


def _prose(text: str) -> str:
    """A docstring-born description as Markdown: reST's double backquotes made single."""
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return " ".join(_prose(text).split()).replace("|", "\\|")


def _field_rows(schema: Schema, names: Iterable[str]) -> list[str]:
    required = set(schema.get("required", ()))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name in names:
        prop = schema["properties"][name]
        default = ""
        if name not in required and "default" in prop and name != "kind":
            default = f" Default `{json.dumps(prop['default'])}`."
        description = _cell(prop.get("description", "") + default)
        kind = _type_of(prop)
        if name == "kind" and "const" in prop:  # the envelope's row: every kind's own
            kind, description = "string", "The event's kind: which model the rest follows."
        rows.append(
            f"| `{name}` | {kind} | {'yes' if name in required else 'no'} | {description} |"
        )
    return rows


def _envelope_fields(kinds: Mapping[str, Schema]) -> list[str]:
    """Fields every kind has (the envelope), in the first kind's order."""
    first = next(iter(kinds.values()))
    common = set(first["properties"])
    for schema in kinds.values():
        common &= set(schema["properties"])
    return [name for name in first["properties"] if name in common]


def _nested_types(kinds: Mapping[str, Schema]) -> dict[str, Schema]:
    """Types the kinds' fields refer to, by name; the TrainingJob is left to its page."""
    found: dict[str, Schema] = {}
    for schema in kinds.values():
        defs = schema.get("$defs", {})
        for name in sorted(_refs(schema.get("properties", {}))):
            if name != _TRAINING_JOB and name in defs:
                found.setdefault(name, defs[name])
                for inner in _refs(defs[name].get("properties", {})):
                    if inner in defs and inner != _TRAINING_JOB:
                        found.setdefault(inner, defs[inner])
    return dict(sorted(found.items()))


def _refs(node: Any) -> set[str]:
    if isinstance(node, Mapping):
        own = {_ref_name(node["$ref"])} if isinstance(node.get("$ref"), str) else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _kind_section(kind: str, schema: Schema, envelope: list[str]) -> list[str]:
    title = schema.get("title", kind)
    lines = [f"### `{kind}`", "", f"{title}: {_prose(schema.get('description', ''))}"]
    own = [n for n in schema["properties"] if n not in envelope]
    lines += [""]
    if own:
        lines += _field_rows(schema, own)
    else:
        lines += ["No fields beyond the envelope."]
    if kind == "job_submitted":
        lines += [
            "",
            "The `spec` is a whole TrainingJob: see [jobspec.md](jobspec.md) and "
            "[schemas/TrainingJob.schema.json](schemas/TrainingJob.schema.json).",
        ]
    lines += ["", f"Schema: [schemas/{kind}.schema.json](schemas/{kind}.schema.json)", ""]
    return lines


def _family_section(family: Family, kinds: Mapping[str, Schema], envelope: list[str]) -> list[str]:
    lines = [
        f"## `{family.name}`: `{family.address}`",
        "",
        family.summary,
        "",
        f"- Stream: {family.stored}",
        f"- Published by: {family.publishers}",
        f"- Read by: {family.subscribers}",
        "",
        "| parameter | meaning |",
        "|---|---|",
    ]
    for param in family.parameters:
        values = f" One of {', '.join(f'`{v}`' for v in param.enum)}." if param.enum else ""
        lines.append(f"| `{param.name}` | {_cell(param.description + values)} |")
    lines += [""]
    if family.note:
        lines += [family.note, ""]
    for kind in family.kinds:
        lines += _kind_section(kind, kinds[kind], envelope)
    return lines


_READER_WORDS = {
    Reader.DURABLE: "durable consumer",
    Reader.BATCHES: "durable consumer, in batches",
    Reader.WATCH: "core subscription, while it waits",
    Reader.INBOX: "command inbox (direct gets)",
}


def _subscriptions_section() -> list[str]:
    """Every service's subscriptions, from their declarations."""
    lines = [
        "## Who reads what",
        "",
        "Each service's subscriptions, as it declares them (`resurge.contract."
        "subscriptions`); its NATS permissions allow these and no others. `{group}` is "
        "the detector's consumer group (`detector`, or `detector-<i>-of-<n>` for one of "
        "several partitions).",
        "",
        "| service | subject | read as | consumer | kinds | what it does with them |",
        "|---|---|---|---|---|---|",
    ]
    for entry in SUBSCRIPTIONS:
        subject = entry.subject(_SUBJECTS, Scope())
        consumer = f"`{entry.durable}`" if entry.durable else ""
        kinds = ", ".join(f"`{k}`" for k in entry.kinds)
        if entry.kinds == stream_family(entry.family).kinds and len(entry.kinds) > 1:
            kinds = "every kind"
        reader = _READER_WORDS[entry.reader] + (", new only" if entry.start == "new" else "")
        lines.append(
            f"| {entry.service} | `{subject}` | {reader} | {consumer} | {kinds} "
            f"| {_cell(entry.reads)} |"
        )
    return [*lines, ""]


def _type_section(name: str, schema: Schema) -> list[str]:
    lines = [f"### {name}", "", _prose(schema.get("description", "")), ""]
    if "enum" in schema:
        lines.append("One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".")
    elif "properties" in schema:
        lines += _field_rows(schema, schema["properties"])
    return [*lines, ""]


def _overview(kinds: Mapping[str, Schema]) -> list[str]:
    lines = [
        "| family | subject | stream | kinds |",
        "|---|---|---|---|",
    ]
    for family in FAMILIES:
        listed = ", ".join(f"[`{k}`](#{k})" for k in family.kinds)
        lines.append(
            f"| [`{family.name}`](#{family.name}-{_anchor(family.address)}) "
            f"| `{family.address}` | {', '.join(f'`{n}`' for n in family.streams)} | {listed} |"
        )
    return lines


def _anchor(text: str) -> str:
    """The part of a GitHub heading anchor that ``text`` (in backquotes) contributes."""
    return "".join(c for c in text.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def events_markdown(schemas: Mapping[str, Schema]) -> str:
    """``docs/events.md``: every subject family, its parameters and each kind's fields."""
    kinds = event_kinds(schemas)
    _check(kinds)
    envelope = _envelope_fields(kinds)
    first = next(iter(kinds.values()))
    lines = [
        "# Events reference",
        "",
        f"<!-- {_HEADER} -->",
        "",
        "Every message resurge sends over NATS is one event: a JSON object whose `kind` "
        "names its model. Subjects start with the namespace (`resurge` unless "
        "`RESURGE_NAMESPACE` says otherwise) and the contract version `v1`; every family "
        "is stored in its own JetStream stream, so a subscriber can read history back. "
        "[concepts.md](concepts.md) explains the words used here; the same contract as an "
        "AsyncAPI 3.0 document is [asyncapi.yaml](asyncapi.yaml), and each kind's JSON "
        "Schema is in [schemas/](schemas/) (`resurge schema` prints them all).",
        "",
        "Names in subjects (jobs, nodes) are escaped into one token: letters, digits and "
        "`-` pass unchanged, `_` is doubled, any other character becomes `_xx` per UTF-8 "
        "byte (`a.b` becomes `a_2eb`). Subscribe with NATS wildcards: "
        "`resurge.v1.fault.>` is every fault, `resurge.v1.raw.*.progress.*` every "
        "progress report.",
        "",
        *_overview(kinds),
        "",
        "## The envelope",
        "",
        "Fields every event has; those that do not apply to a kind are null. In the "
        "tables, *required* says whether a publisher must give the field: the others "
        "have defaults, and events resurge publishes carry every field.",
        "",
        *_field_rows(first, envelope),
        "",
        "A message that does not decode (not JSON, an unknown `kind`, a field that does not "
        "validate, an unknown `schema_version`) is never fatal: the service that got it "
        "counts it, logs it, and publishes a `dead_letter` on `dlq.<service>`.",
        "",
    ]
    for family in FAMILIES:
        lines += _family_section(family, kinds, envelope)
    lines += _subscriptions_section()
    lines += ["## Types used by the fields", ""]
    for name, schema in _nested_types(kinds).items():
        lines += _type_section(name, schema)
    return "\n".join(lines).rstrip() + "\n"


# ---- AsyncAPI ------------------------------------------------------------------------


def _hoist(kinds: Mapping[str, Schema]) -> dict[str, Any]:
    """Each kind's schema and its ``$defs`` as components, refs pointed at them."""
    components: dict[str, Any] = {}
    for kind, schema in kinds.items():
        plain = json.loads(json.dumps(schema).replace('"#/$defs/', '"#/components/schemas/'))
        defs = plain.pop("$defs", {})
        for name, definition in defs.items():
            if components.setdefault(name, definition) != definition:
                raise ValueError(f"two different schemas are both named {name}")
        components[kind] = plain
    return dict(sorted(components.items()))


def _message(kind: str, schema: Schema) -> dict[str, Any]:
    return {
        "name": kind,
        "title": schema.get("title", kind),
        "summary": schema.get("description", ""),
        "contentType": "application/json",
        "payload": {"$ref": f"#/components/schemas/{kind}"},
    }


def _channel(family: Family) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    for param in family.parameters:
        parameters[param.name] = {"description": param.description}
        if param.enum:
            parameters[param.name]["enum"] = list(param.enum)
    return {
        "address": family.address,
        "title": family.name,
        "summary": family.summary,
        "description": f"Stored in JetStream: {family.stored}. Published by "
        f"{family.publishers}. Read by {family.subscribers}.",
        "parameters": parameters,
        "messages": {k: {"$ref": f"#/components/messages/{k}"} for k in family.kinds},
    }


def asyncapi_document(schemas: Mapping[str, Schema]) -> dict[str, Any]:
    """``docs/asyncapi.yaml`` as data: one channel per subject family, one receive
    operation each, one message per event kind whose payload is the kind's schema."""
    kinds = event_kinds(schemas)
    _check(kinds)
    versions = [s["properties"]["schema_version"].get("default", 1) for s in kinds.values()]
    document = {
        "asyncapi": "3.0.0",
        "info": {
            "title": "resurge events",
            "version": f"v1 (schema_version {max(versions)})",
            "description": _HEADER + " Subjects under the default namespace `resurge`; "
            "RESURGE_NAMESPACE replaces the first token. Operations are written from a "
            "subscriber's side. The human-readable form is events.md.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": "A NATS server with JetStream at the services' default "
                "RESURGE_NATS_URL; `resurge up` starts its own server and records its "
                "address in the state folder.",
            }
        },
        "channels": {family.name: _channel(family) for family in FAMILIES},
        "operations": {
            f"receive_{family.name}": {
                "action": "receive",
                "channel": {"$ref": f"#/channels/{family.name}"},
                "summary": family.summary,
                "messages": [
                    {"$ref": f"#/channels/{family.name}/messages/{k}"} for k in family.kinds
                ],
            }
            for family in FAMILIES
        },
        "components": {
            "messages": {k: _message(k, s) for k, s in kinds.items()},
            "schemas": _hoist(kinds),
        },
    }
    return document


def asyncapi_yaml(schemas: Mapping[str, Schema]) -> str:
    """:func:`asyncapi_document` as the YAML text of ``docs/asyncapi.yaml``."""
    body = yaml.safe_dump(
        asyncapi_document(schemas), sort_keys=False, width=100, allow_unicode=True
    )
    return f"# {_HEADER}\n{body}"


_WRITERS: dict[str, Callable[[Mapping[str, Schema]], str]] = {
    "events": events_markdown,
    "asyncapi": asyncapi_yaml,
}


def main(argv: list[str] | None = None) -> int:
    """Read ``resurge schema``'s document on stdin; write one output."""
    parser = argparse.ArgumentParser(
        prog="python -m resurge.contract.reference",
        description="Write the events reference (Markdown) or the AsyncAPI document from "
        "the JSON document `resurge schema` prints, read on stdin.",
    )
    parser.add_argument("output", choices=sorted(_WRITERS), help="what to write")
    parser.add_argument("path", nargs="?", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    text = _WRITERS[args.output](json.load(sys.stdin))
    if args.path is None:
        sys.stdout.write(text)
    else:
        args.path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
