"""Every declared subscriber, through a real nats-server: bad messages are terminated,
counted by reason, dead-lettered, and the good message right after is still handled.

The cases come from the declarations (:mod:`resurge.contract.subscriptions`): every
entry whose reader is a durable consumer, a batch reader or a command inbox, bound the
way the services bind it (``Bus.bind``, ``CommandInbox.declared``). A batch reader that
leaves bad messages to another reader (``dead_letters=False``; none is declared so
now) skips them: acked, neither counted nor dead-lettered. A test holds the services to
binding only through the declarations, so a consumer the table misses cannot exist.
"""

from __future__ import annotations

import ast
import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from resurge.contract import subscriptions as declared
from resurge.contract.subjects import (
    NODE_LEVEL_JOB,
    RAW_KIND_TOKEN,
    Subjects,
    raw_subject_mismatch,
)
from resurge.contract.subscriptions import SUBSCRIPTIONS, Reader, Scope, Subscription
from resurge.events import (
    EVENT_KINDS,
    DeadLetter,
    DeadLetterReason,
    DecodeError,
    Envelope,
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
# A concrete subject of each family, for subscriptions that read the whole family.
_CONCRETE: dict[str, Callable[[Subjects, str], str]] = {
    "raw": lambda s, kind: s.raw(JOB, kind, NODE),
    "fault": lambda s, _: s.fault(JOB, "process"),
    "capacity": lambda s, _: s.capacity(NODE),
    "action": lambda s, _: s.action(JOB),
    "job": lambda s, _: s.job(JOB),
}


@dataclass(frozen=True)
class Consumer:
    """One declared subscription, bound once."""

    entry: Subscription

    @property
    def service(self) -> str:
        return self.entry.service

    @property
    def scope(self) -> Scope:
        """Its binding (each example has a namespace of its own: names may repeat)."""
        return Scope(job=JOB, replica=0, node=NODE, group="prop")

    @property
    def expects(self) -> tuple[type[Envelope], ...]:
        return tuple(EVENT_KINDS[k] for k in self.entry.kinds)

    @property
    def batches(self) -> bool:
        return self.entry.reader is Reader.BATCHES

    @property
    def dead_letters(self) -> bool:
        return self.entry.dead_letters

    def publish_on(self, subjects: Subjects) -> str:
        """A subject the subscription reads, of its first kind."""
        subject = self.entry.subject(subjects, self.scope)
        if "*" in subject.split(".") or subject.endswith(">"):
            return _CONCRETE[self.entry.family](subjects, self.entry.kinds[0])
        return subject


TESTED = (Reader.DURABLE, Reader.BATCHES, Reader.INBOX)
CONSUMERS = [Consumer(entry) for entry in SUBSCRIPTIONS if entry.reader in TESTED]

_BINDINGS = {"consume", "consume_batches", "subscribe", "CommandInbox"}
# The names the services bind declared subscriptions by.
DECLARED = {n for n in declared.__all__ if isinstance(getattr(declared, n), Subscription)}


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else None


def bindings_in_services() -> tuple[list[str], set[str]]:
    """Calls in the services' source that bind a subscription other than through a
    declaration (where), and the declarations the source names."""
    direct: list[str] = []
    named: set[str] = set()
    for path in (REPO_ROOT / "services").glob("*/resurge_*/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if _called(node) in _BINDINGS:
                direct.append(f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', 0)}")
            if isinstance(node, ast.Name | ast.Attribute):
                name = node.id if isinstance(node, ast.Name) else node.attr
                if name in DECLARED:
                    named.add(name)
    return direct, named


def test_services_bind_only_declared_subscriptions_and_every_one_is_bound() -> None:
    direct, named = bindings_in_services()
    assert direct == [], "bind through resurge.contract.subscriptions (Bus.bind)"
    assert named == DECLARED


def test_declarations_name_each_consumer_once() -> None:
    keys = [(e.service, e.name) for e in SUBSCRIPTIONS]
    assert len(keys) == len(set(keys))
    durable = [
        (e.service, e.durable)
        for e in SUBSCRIPTIONS
        if e.reader in (Reader.DURABLE, Reader.BATCHES)
    ]
    assert len(durable) == len(set(durable))
    assert {e.role for e in SUBSCRIPTIONS} == {"agent", "detector", "restarter", "scaler"}


def expected_reason(body: bytes, consumer: Consumer, subject: str) -> DeadLetterReason | None:
    """Why ``consumer`` cannot use ``body`` on ``subject``; None if it can."""
    try:
        event = decode_event(body)
    except DecodeError as error:
        return error.reason
    if raw_subject_mismatch(subject, event.job, event.node) is not None:
        return DeadLetterReason.SUBJECT_MISMATCH
    if consumer.batches:
        token = subject.split(".")[RAW_KIND_TOKEN]
        return None if event.kind == token else DeadLetterReason.UNEXPECTED_KIND
    return None if isinstance(event, consumer.expects) else DeadLetterReason.UNEXPECTED_KIND


def on_its_subject(event: Envelope, subject: str) -> Envelope:
    """``event`` naming the job and node of ``subject`` where it is a raw subject (a
    raw event naming others is dead-lettered): its job (none on a node-level subject)
    and node; ``event`` itself on any other subject."""
    tokens = subject.split(".")
    if raw_subject_mismatch(subject, event.job, event.node) is None:
        return event
    job = None if tokens[3] == NODE_LEVEL_JOB else JOB
    return event.model_copy(update={"job": job, "node": NODE})


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


@pytest.mark.parametrize("consumer", CONSUMERS, ids=lambda c: f"{c.service}-{c.entry.name}")
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
    good = on_its_subject(data.draw(event_of(consumer.expects[0])), subject)
    wanted = Counter(str(expected_reason(body, consumer, subject)) for body in bad)
    if not consumer.dead_letters:  # left to another reader of the same messages
        wanted = Counter()

    seen = Seen()

    async def on_letter(msg: Any) -> None:
        letter = decode_event(msg.data)
        assert isinstance(letter, DeadLetter)
        seen.letters.append(letter)

    dlq = await bus.nc.subscribe(bus.subjects.dlq(consumer.service), cb=on_letter)
    before = dead_lettered(registry)
    durable = consumer.entry.consumer(consumer.scope)
    inbox: CommandInbox | None = None
    if consumer.entry.reader is Reader.INBOX:
        inbox = CommandInbox.declared(bus, consumer.entry, consumer.scope, seen.handler)
        inboxes.append(inbox)
        await inbox.start()
        # One handled first: the catch-up at start is over, the bad ones come live.
        first = on_its_subject(data.draw(event_of(consumer.expects[0])), subject)
        await bus.js.publish(subject, encode_event(first), headers={"Nats-Msg-Id": first.id})
        assert await asyncio.wait_for(seen.handled.get(), WAIT) == first
    else:
        await bus.bind(consumer.entry, seen.handler, consumer.scope)
    for body in bad:
        await bus.js.publish(subject, body)
    await bus.js.publish(subject, encode_event(good), headers={"Nats-Msg-Id": good.id})

    handled = await asyncio.wait_for(seen.handled.get(), WAIT)
    assert handled == good
    after = dead_lettered(registry)
    assert Counter({r: after[r] - before[r] for r in after if after[r] != before[r]}) == wanted
    await until(lambda: len(seen.letters) >= sum(wanted.values()), "the dead letters")
    assert Counter(letter.reason.value for letter in seen.letters) == wanted
    assert all(letter.subject == subject for letter in seen.letters)

    if inbox is not None:  # no consumer in the server: each message was read once
        await inbox.close()
        assert seen.handled.empty()
        assert len(seen.letters) == len(bad)
        await dlq.unsubscribe()
        return

    stream = bus.subjects.stream(consumer.entry.stream)

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
