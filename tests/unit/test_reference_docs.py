"""docs/events.md and docs/asyncapi.yaml: current, complete, and a valid AsyncAPI 3.0."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from resurge.cli.schemas import all_schemas
from resurge.contract.reference import (
    FAMILIES,
    asyncapi_document,
    asyncapi_yaml,
    event_kinds,
    events_markdown,
)
from resurge.contract.subjects import Subjects
from resurge.events import EVENT_KINDS, FaultDetected, Source, Stop, encode_event

DOCS = Path(__file__).resolve().parents[2] / "docs"
REGENERATE = "run `make schemas` (or `resurge schema | python -m resurge.contract.reference {}`)"


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    # as `resurge schema` prints it: through JSON
    printed: dict[str, Any] = json.loads(json.dumps(all_schemas(), sort_keys=True))
    return printed


@pytest.fixture(scope="module")
def document(schemas: dict[str, Any]) -> dict[str, Any]:
    return asyncapi_document(schemas)


def test_events_markdown_is_current(schemas: dict[str, Any]) -> None:
    committed = (DOCS / "events.md").read_text()
    assert committed == events_markdown(schemas), (
        f"docs/events.md is stale: {REGENERATE.format('events docs/events.md')}"
    )


def test_asyncapi_yaml_is_current(schemas: dict[str, Any], document: dict[str, Any]) -> None:
    committed = (DOCS / "asyncapi.yaml").read_text()
    assert committed == asyncapi_yaml(schemas), (
        f"docs/asyncapi.yaml is stale: {REGENERATE.format('asyncapi docs/asyncapi.yaml')}"
    )
    assert yaml.safe_load(committed) == document


def test_every_kind_has_one_family_and_appears_in_both_documents(
    schemas: dict[str, Any], document: dict[str, Any]
) -> None:
    assert set(event_kinds(schemas)) == set(EVENT_KINDS)
    listed = [kind for family in FAMILIES for kind in family.kinds]
    assert sorted(listed) == sorted(EVENT_KINDS)
    markdown = events_markdown(schemas)
    for kind in EVENT_KINDS:
        assert f"### `{kind}`" in markdown
        assert kind in document["components"]["messages"]
        assert kind in document["components"]["schemas"]


def test_a_kind_without_a_family_is_refused(schemas: dict[str, Any]) -> None:
    extra = dict(schemas)
    extra["new_kind"] = {"properties": {"kind": {"const": "new_kind"}}}
    with pytest.raises(ValueError, match="new_kind"):
        events_markdown(extra)


def test_addresses_come_from_the_subject_builders() -> None:
    subjects = Subjects()
    addresses = {family.name: family.address for family in FAMILIES}
    assert addresses["raw"] == "resurge.v1.raw.{job}.{kind}.{node}"
    assert addresses["fault"] == "resurge.v1.fault.{job}.{scope}"
    assert addresses["cmd"] == "resurge.v1.cmd.{job}.{replica}"
    for family in FAMILIES:
        wildcards = re.sub(r"\{[a-z]+\}", "*", family.address)
        assert wildcards == family.build(subjects)
        assert family.stream == subjects.stream(family.name)


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_asyncapi_document_is_structurally_valid(document: dict[str, Any]) -> None:
    assert document["asyncapi"] == "3.0.0"
    assert document["info"]["title"] and isinstance(document["info"]["version"], str)
    assert set(document["channels"]) == {family.name for family in FAMILIES}
    for name, channel in document["channels"].items():
        placeholders = re.findall(r"\{([a-z]+)\}", channel["address"])
        assert placeholders == list(channel["parameters"]), name
        assert channel["messages"]
    for operation in document["operations"].values():
        assert operation["action"] in ("send", "receive")
        channel = _resolve(document, operation["channel"]["$ref"])
        for message in operation["messages"]:
            # an operation's messages must be its channel's
            assert message["$ref"].startswith(operation["channel"]["$ref"] + "/messages/")
            assert _resolve(document, message["$ref"]) in channel["messages"].values()
    for kind, message in document["components"]["messages"].items():
        assert message["contentType"] == "application/json"
        payload = _resolve(document, message["payload"]["$ref"])
        assert payload["properties"]["kind"]["const"] == kind
    for ref in _refs(document):  # every reference resolves inside the document
        _resolve(document, ref)


def test_payload_schemas_validate_real_events(document: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")  # untyped: Any
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    root = "urn:resurge:asyncapi"
    registry: Registry[Any] = Registry().with_resource(
        root, Resource.from_contents(document, default_specification=DRAFT202012)
    )

    def validator(kind: str) -> Any:
        schema = document["components"]["schemas"][kind]
        jsonschema.Draft202012Validator.check_schema(schema)
        return jsonschema.Draft202012Validator(
            {"$ref": f"{root}#/components/schemas/{kind}"}, registry=registry
        )

    for kind in EVENT_KINDS:
        validator(kind)
    source = Source(service="test", instance="here:1")
    fault = FaultDetected(
        source=source, job="a.b", fault_id="crash:a:g0:r1", reason="crash", scope="process"
    )
    stop = Stop(source=source, job="a.b", replica=0, generation=3, hung_ranks=[1])
    for event in (fault, stop):
        instance = json.loads(encode_event(event))
        validator(event.kind).validate(instance)
        with pytest.raises(jsonschema.ValidationError):
            validator(event.kind).validate({**instance, "kind": "not_a_kind"})
