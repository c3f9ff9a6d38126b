"""Every subscriber, through a real nats-server: bad messages are terminated, counted by
reason, dead-lettered, and the good message right after is still handled.

Each service consumes with ``Bus.consume(..., expects=...)``, the detector and the
restarter's progress reader with ``consume_batches`` and a kind token, and a launch
agent reads its commands through a ``CommandInbox(..., expects=...)`` (no consumer in
the server); the table below repeats each one's subject and ``expects``, and a test
reads the services' source to keep the table complete.
"""

from __future__ import annotations

import ast
import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from resurge.contract.subjects import RAW_KIND_TOKEN, Subjects
from resurge.events import (
    Assign,
    CapacityChanged,
    CheckpointNow,
    CheckpointSaved,
    DeadLetter,
    DeadLetterReason,
    DecodeError,
    Envelope,
    FaultDetected,
    InjectFault,
    InjectGpuError,
    JobDeleted,
    JobSubmitted,
    PhaseChanged,
    ProcessExited,
    ProcessStarted,
    Progress,
    RecoveryFinished,
    RecoveryStarted,
    RendezvousPassed,
    RepairNode,
    ReplicaFinished,
    ScaleDecided,
    Stop,
    decode_event,
    encode_event,
)
from resurge.runtime.bus import Bus
from resurge.runtime.command_inbox import CommandInbox
from resurge.runtime.settings import Settings
from tests.conftest import REPO_ROOT
from tests.property.strategies import event_of, events

JOB = "job.with.dots"
NODE = "node-0"
WAIT = 20.0


@dataclass(frozen=True)
class Consumer:
    """One consumer of one service: where it reads, what it takes."""

    service: str
    filter: Callable[[Subjects], str]
    publish_on: Callable[[Subjects], str]
    expects: tuple[type[Envelope], ...]
    # consume: a durable consumer; batches: consume_batches with the raw kind token;
    # inbox: a CommandInbox (core subscription, caught up from the stream)
    reader: Literal["consume", "batches", "inbox"] = "consume"

    @property
    def batches(self) -> bool:
        return self.reader == "batches"


CONSUMERS = [
    Consumer(
        "restarter", lambda s: s.all("fault"), lambda s: s.fault(JOB, "process"), (FaultDetected,)
    ),
    Consumer(
        "restarter",
        lambda s: s.raw(None, "process_started", None),
        lambda s: s.raw(JOB, "process_started", NODE),
        (ProcessStarted,),
    ),
    Consumer(
        "restarter",
        lambda s: s.raw(None, "progress", None),
        lambda s: s.raw(JOB, "progress", NODE),
        (Progress,),  # the kind its subject names
        reader="batches",
    ),
    Consumer(
        "restarter",
        lambda s: s.raw(None, "checkpoint_saved", None),
        lambda s: s.raw(JOB, "checkpoint_saved", NODE),
        (CheckpointSaved,),
    ),
    Consumer(
        "restarter",
        lambda s: s.raw(None, "rendezvous_passed", None),
        lambda s: s.raw(JOB, "rendezvous_passed", NODE),
        (RendezvousPassed,),
    ),
    Consumer(
        "restarter",
        lambda s: s.raw(None, "process_exited", None),
        lambda s: s.raw(JOB, "process_exited", NODE),
        (ProcessExited,),
    ),
    Consumer(
        "scaler",
        lambda s: s.all("job"),
        lambda s: s.job(JOB),
        (JobSubmitted, ReplicaFinished, JobDeleted),
    ),
    Consumer(
        "scaler",
        lambda s: s.action(None),
        lambda s: s.action(JOB),
        (PhaseChanged, RecoveryStarted, RecoveryFinished, ScaleDecided),
    ),
    Consumer("scaler", lambda s: s.all("capacity"), lambda s: s.capacity(NODE), (CapacityChanged,)),
    Consumer(
        "node-agent",
        lambda s: s.node_cmd(NODE),
        lambda s: s.node_cmd(NODE),
        (InjectGpuError, RepairNode),
    ),
    Consumer(
        "node-agent",
        lambda s: s.cmd(JOB, 0),
        lambda s: s.cmd(JOB, 0),
        (Assign, Stop, InjectFault, CheckpointNow),
        reader="inbox",
    ),
    Consumer(
        "detector",
        lambda s: s.all("raw"),
        lambda s: s.raw(JOB, "process_started", NODE),
        (ProcessStarted,),  # the kind its subject names
        reader="batches",
    ),
]


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else None


def consumed_in_services() -> set[tuple[str, frozenset[str]]]:
    """Each ``consume`` call's and ``CommandInbox`` construction's ``expects=`` in the
    services' source, with which of the two it is."""
    found: set[tuple[str, frozenset[str]]] = set()
    for path in (REPO_ROOT / "services").glob("*/resurge_*/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            called = _called(node)
            if called not in ("consume", "CommandInbox"):
                continue
            assert isinstance(node, ast.Call)
            reader = "inbox" if called == "CommandInbox" else "consume"
            for keyword in node.keywords:
                if keyword.arg == "expects" and isinstance(keyword.value, ast.Tuple):
                    names = [e.id for e in keyword.value.elts if isinstance(e, ast.Name)]
                    found.add((reader, frozenset(names)))
    return found


def test_the_table_has_every_consumer_of_every_service() -> None:
    table = {
        (c.reader, frozenset(m.__name__ for m in c.expects)) for c in CONSUMERS if not c.batches
    }
    assert table == consumed_in_services()
    detector = (REPO_ROOT / "services/detector/resurge_detector/service.py").read_text()
    assert "consume_batches(" in detector
    assert "kind_token=RAW_KIND_TOKEN" in detector
    restarter = (REPO_ROOT / "services/restarter/resurge_restarter/service.py").read_text()
    assert restarter.count("consume_batches(") == 1
    assert "kind_token=RAW_KIND_TOKEN" in restarter


def expected_reason(body: bytes, consumer: Consumer, subject: str) -> DeadLetterReason | None:
    """Why ``consumer`` cannot use ``body`` on ``subject``; None if it can."""
    try:
        event = decode_event(body)
    except DecodeError as error:
        return error.reason
    if consumer.batches:
        token = subject.split(".")[RAW_KIND_TOKEN]
        return None if event.kind == token else DeadLetterReason.UNEXPECTED_KIND
    return None if isinstance(event, consumer.expects) else DeadLetterReason.UNEXPECTED_KIND


def truncated(event: Envelope, share: float) -> bytes:
    body = encode_event(event)
    return body[: int(len(body) * share)]


def with_field(event: Envelope, name: str, value: Any) -> bytes:
    document = json.loads(encode_event(event))
    document[name] = value
    return json.dumps(document).encode()


BAD_BODIES = st.one_of(
    st.binary(max_size=64),
    st.builds(truncated, events, st.floats(0, 0.99)),
    st.builds(with_field, events, st.just("schema_version"), st.integers(2, 10**6)),
    st.builds(with_field, events, st.just("kind"), st.text(max_size=12)),
    st.builds(with_field, events, st.sampled_from(["source", "time", "id"]), st.integers()),
    events.map(encode_event),  # valid, but most kinds are not what a consumer takes
    st.just(b'{"kind":"log_line","line":"' + b"x" * 20_000 + b'"}'),
    st.just(b"[" * 3_000),
)


class Seen:
    """What a consumer's handler got, and the dead letters of one service."""

    def __init__(self) -> None:
        self.handled: asyncio.Queue[Envelope] = asyncio.Queue()
        self.letters: list[DeadLetter] = []

    async def handler(self, event: Any) -> None:
        for one in event if isinstance(event, list) else [event]:
            await self.handled.put(one)


def dead_lettered(registry: CollectorRegistry) -> Counter[str]:
    counts: Counter[str] = Counter()
    for reason in DeadLetterReason:
        value = registry.get_sample_value("resurge_dead_letters_total", {"reason": reason.value})
        counts[reason.value] = int(value or 0)
    return counts


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "consumer", CONSUMERS, ids=lambda c: f"{c.service}-{c.expects[0].__name__}"
)
@settings(
    max_examples=3,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking through a server is slow
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(bad=st.lists(BAD_BODIES, min_size=1, max_size=5), data=st.data())
async def test_bad_messages_are_terminated_counted_dead_lettered_and_the_next_is_handled(
    nats_url: str,
    consumer: Consumer,
    bad: list[bytes],
    data: st.DataObject,
) -> None:
    # A namespace (streams and all) per example: nothing of an earlier one is delivered.
    settings = Settings(nats_url=nats_url, namespace=f"p{uuid.uuid4().hex[:10]}")
    registry = CollectorRegistry()
    bus = await Bus.connect(settings, consumer.service, registry)
    inboxes: list[CommandInbox] = []
    try:
        await bus.ensure_streams()
        await check_consumer(bus, registry, consumer, bad, data, inboxes)
    finally:
        for inbox in inboxes:
            await inbox.close()
        await bus.close()


async def check_consumer(
    bus: Bus,
    registry: CollectorRegistry,
    consumer: Consumer,
    bad: list[bytes],
    data: st.DataObject,
    inboxes: list[CommandInbox],
) -> None:
    subject = consumer.publish_on(bus.subjects)
    bad = [body for body in bad if expected_reason(body, consumer, subject) is not None]
    good = data.draw(event_of(consumer.expects[0]))
    wanted = Counter(str(expected_reason(body, consumer, subject)) for body in bad)

    seen = Seen()

    async def on_letter(msg: Any) -> None:
        letter = decode_event(msg.data)
        assert isinstance(letter, DeadLetter)
        seen.letters.append(letter)

    dlq = await bus.nc.subscribe(bus.subjects.dlq(consumer.service), cb=on_letter)
    before = dead_lettered(registry)
    durable = f"prop-{uuid.uuid4().hex[:10]}"
    inbox: CommandInbox | None = None
    if consumer.reader == "inbox":
        inbox = CommandInbox(
            bus, consumer.filter(bus.subjects), seen.handler, expects=consumer.expects
        )
        inboxes.append(inbox)
        await inbox.start()
        # One handled first: the catch-up at start is over, the bad ones come live.
        first = data.draw(event_of(consumer.expects[0]))
        await bus.js.publish(subject, encode_event(first), headers={"Nats-Msg-Id": first.id})
        assert await asyncio.wait_for(seen.handled.get(), WAIT) == first
    elif consumer.batches:
        await bus.consume_batches(
            consumer.filter(bus.subjects), durable, seen.handler, kind_token=RAW_KIND_TOKEN
        )
    else:
        await bus.consume(
            consumer.filter(bus.subjects), durable, seen.handler, expects=consumer.expects
        )
    for body in bad:
        await bus.js.publish(subject, body)
    await bus.js.publish(subject, encode_event(good), headers={"Nats-Msg-Id": good.id})

    handled = await asyncio.wait_for(seen.handled.get(), WAIT)
    assert handled == good
    after = dead_lettered(registry)
    assert Counter({r: after[r] - before[r] for r in after if after[r] != before[r]}) == wanted
    await until(lambda: len(seen.letters) >= len(bad), "the dead letters")
    assert Counter(letter.reason.value for letter in seen.letters) == wanted
    assert all(letter.subject == subject for letter in seen.letters)

    if inbox is not None:  # no consumer in the server: each message was read once
        await inbox.close()
        assert seen.handled.empty()
        assert len(seen.letters) == len(bad)
        await dlq.unsubscribe()
        return

    stream = bus.subjects.stream(subject.split(".")[2])

    async def settled() -> bool:
        info = await bus.js.consumer_info(stream, durable)
        counts = (info.num_ack_pending, info.num_pending, info.num_redelivered)
        return bool(counts == (0, 0, 0))

    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not await settled():  # terminated or acked, never redelivered
        assert loop.time() < deadline, "messages left unacknowledged or redelivered"
        await asyncio.sleep(0.05)
    assert seen.handled.empty()
    await dlq.unsubscribe()
