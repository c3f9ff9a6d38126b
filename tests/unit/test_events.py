import json
from pathlib import Path

import pytest

from resurge.cli.schemas import all_schemas, write_schemas
from resurge.events import (
    EVENT_KINDS,
    DeadLetterReason,
    DecodeError,
    FaultDetected,
    FaultScope,
    ProcessExited,
    Source,
    decode_event,
    encode_event,
)

SOURCE = Source(service="test", instance="here:1")


def test_round_trip_keeps_kind_and_fields() -> None:
    event = ProcessExited(
        source=SOURCE,
        job="j",
        pid=7,
        local_rank=1,
        local_world_size=2,
        exit_code=None,
        signal="SIGKILL",
        generation=3,
    )
    back = decode_event(encode_event(event))
    assert isinstance(back, ProcessExited)
    assert back == event


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe", DeadLetterReason.NOT_JSON),
        (b"{not json", DeadLetterReason.NOT_JSON),
        (b"[1, 2]", DeadLetterReason.INVALID),
        (b'{"kind": "no_such_kind"}', DeadLetterReason.UNKNOWN_KIND),
        (b'{"id": "x"}', DeadLetterReason.UNKNOWN_KIND),
        (b'{"kind": "process_exited", "pid": "seven"}', DeadLetterReason.INVALID),
    ],
)
def test_bad_payloads_fail_with_a_reason(payload: bytes, reason: DeadLetterReason) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_event(payload)
    assert caught.value.reason is reason


def test_invalid_fields_are_named() -> None:
    event = json.loads(
        encode_event(
            FaultDetected(source=SOURCE, fault_id="f", scope=FaultScope.PROCESS, reason="r")
        )
    )
    event["scope"] = "galaxy"
    del event["fault_id"]
    with pytest.raises(DecodeError) as caught:
        decode_event(json.dumps(event).encode())
    assert "scope" in caught.value.detail and "fault_id" in caught.value.detail


def test_unknown_extra_field_is_rejected() -> None:
    data = json.loads(
        encode_event(FaultDetected(source=SOURCE, fault_id="f", scope=FaultScope.NODE, reason="r"))
    )
    data["surprise"] = 1
    with pytest.raises(DecodeError, match="surprise"):
        decode_event(json.dumps(data).encode())


def test_every_field_of_every_kind_has_a_description() -> None:
    for kind, model in EVENT_KINDS.items():
        for name, field in model.model_fields.items():
            if name != "kind":
                assert field.description, f"{kind}.{name} has no description"


def test_schemas_cover_every_kind_and_are_written(tmp_path: Path) -> None:
    schemas = all_schemas()
    assert set(EVENT_KINDS) <= set(schemas)
    assert schemas["event"]["discriminator"]["propertyName"] == "kind"  # type: ignore[index]
    written = write_schemas(tmp_path)
    assert len(written) == len(schemas)
    assert json.loads((tmp_path / "fault_detected.schema.json").read_text())["title"] == (
        "FaultDetected"
    )
