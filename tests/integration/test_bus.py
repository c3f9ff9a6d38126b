"""The bus against a real nats-server: streams, de-duplication, consumers, dead letters."""

import asyncio

import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from resurge.events import (
    DeadLetter,
    DeadLetterReason,
    Envelope,
    Event,
    FaultDetected,
    FaultScope,
    JobDeleted,
    LogLine,
    ProcessExited,
    decode_event,
    encode_event,
)
from resurge.runtime.bus import Bus, PermanentError, TransientError
from resurge.runtime.settings import Settings


def fault(bus: Bus, fault_id: str = "f1") -> FaultDetected:
    return FaultDetected(
        source=bus.source,
        job="j.1",
        fault_id=fault_id,
        scope=FaultScope.PROCESS,
        reason="process_crash",
    )


async def collect(bus: Bus, subject: str) -> asyncio.Queue[Event]:
    queue: asyncio.Queue[Event] = asyncio.Queue()

    async def on(event: Event, _subject: str) -> None:
        await queue.put(event)

    await bus.subscribe(subject, on)
    await bus.nc.flush()
    return queue


async def test_streams_are_created_idempotently(bus: Bus) -> None:
    await bus.ensure_streams()
    await bus.ensure_streams()
    info = await bus.js.stream_info(bus.subjects.stream("fault"))
    assert info.config.subjects == [bus.subjects.all("fault")]


async def test_same_event_id_is_stored_once(bus: Bus) -> None:
    event = fault(bus)
    subject = bus.subjects.fault("j.1", "process")
    await bus.publish(subject, event)
    await bus.publish(subject, event)
    info = await bus.js.stream_info(bus.subjects.stream("fault"))
    assert info.state.messages == 1


async def test_telemetry_is_stored_without_a_msg_id_and_acked_events_with_one(bus: Bus) -> None:
    """publish_nowait (telemetry, sent once) carries no Nats-Msg-Id: nothing to
    de-duplicate, and a header costs every reader its parsing; publish keeps it."""
    line = LogLine(
        source=bus.source, job="j.1", rank=0, local_rank=0, stream="stdout", line="step 1"
    )
    await bus.publish_nowait(bus.subjects.raw("j.1", "log_line", "n0"), line)
    exit_ = ProcessExited(
        source=bus.source, job="j.1", rank=0, local_rank=0, local_world_size=1, pid=7, exit_code=1
    )
    await bus.publish(bus.subjects.raw("j.1", "process_exited", "n0"), exit_)
    first = await bus.js.get_msg(bus.subjects.stream("raw"), seq=1)
    second = await bus.js.get_msg(bus.subjects.stream("raw-faults"), seq=1)  # a stream apart
    assert decode_event(first.data or b"").id == line.id
    assert not (first.headers or {}).get("Nats-Msg-Id")
    assert (second.headers or {}).get("Nats-Msg-Id") == exit_.id


async def test_an_existing_raw_stream_gives_the_fault_grade_kinds_to_their_own(
    bus: Bus,
) -> None:
    """A deployment from before the split: its RAW stream stores every raw subject. The
    services that manage streams narrow it to the telemetry, then make the fault-grade
    stream (two streams may not share a subject); what RAW stored stays there."""
    raw, faults = bus.subjects.stream("raw"), bus.subjects.stream("raw-faults")
    await bus.js.delete_stream(faults)
    await bus.js.update_stream(StreamConfig(name=raw, subjects=[bus.subjects.all("raw")]))
    lane = bus.subjects.raw(None, "process_exited", None)  # an older detector's lane
    await bus.js.add_consumer(raw, ConsumerConfig(durable_name="old-lane", filter_subject=lane))
    exit_ = ProcessExited(
        source=bus.source, job="j", rank=0, local_rank=0, local_world_size=1, pid=7, exit_code=1
    )
    subject = bus.subjects.raw("j", "process_exited", "n0")
    before = await bus.js.publish(subject, encode_event(exit_))
    assert before.stream == raw
    await bus.ensure_streams()
    info = await bus.js.stream_info(raw)
    subjects = info.config.subjects or []
    assert subjects and bus.subjects.all("raw") not in subjects  # the telemetry kinds
    assert info.state.messages == 1  # kept
    after = await bus.js.publish(subject, encode_event(exit_))
    assert after.stream == faults


async def test_consume_hands_over_typed_events_and_acks(bus: Bus) -> None:
    got: asyncio.Queue[FaultDetected] = asyncio.Queue()

    async def handler(event: FaultDetected) -> None:
        await got.put(event)

    await bus.consume(bus.subjects.all("fault"), "t", handler, expects=(FaultDetected,))
    sent = fault(bus)
    await bus.publish(bus.subjects.fault("j.1", "process"), sent)
    received = await asyncio.wait_for(got.get(), 10)
    assert received == sent
    info = await bus.js.consumer_info(bus.subjects.stream("fault"), "t")
    for _ in range(100):  # the ack travels asynchronously; poll the server's view
        if info.num_ack_pending == 0:
            break
        await asyncio.sleep(0.05)
        info = await bus.js.consumer_info(bus.subjects.stream("fault"), "t")
    assert info.num_ack_pending == 0 and info.delivered.stream_seq == 1


async def test_transient_failure_is_redelivered(bus: Bus) -> None:
    attempts: asyncio.Queue[int] = asyncio.Queue()
    count = 0

    async def flaky(event: FaultDetected) -> None:
        nonlocal count
        count += 1
        await attempts.put(count)
        if count == 1:
            raise TransientError("not now")

    await bus.consume(bus.subjects.all("fault"), "flaky", flaky, expects=(FaultDetected,))
    await bus.publish(bus.subjects.fault("j", "process"), fault(bus))
    assert await asyncio.wait_for(attempts.get(), 10) == 1
    assert await asyncio.wait_for(attempts.get(), 10) == 2


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00\xffgarbage", DeadLetterReason.NOT_JSON),
        (b'{"kind": "fault_detected", "fault_id": 3}', DeadLetterReason.INVALID),
        (b'{"kind": "martian"}', DeadLetterReason.UNKNOWN_KIND),
        (None, DeadLetterReason.UNEXPECTED_KIND),
        (b"permanent", DeadLetterReason.INVALID),
    ],
)
async def test_bad_messages_are_counted_dead_lettered_and_survived(
    bus: Bus, payload: bytes | None, reason: DeadLetterReason
) -> None:
    letter_queue = await collect(bus, bus.subjects.dlq("test"))
    handled: asyncio.Queue[Envelope] = asyncio.Queue()

    async def handler(event: FaultDetected) -> None:
        if event.fault_id == "poison":
            raise PermanentError("this fault can never be handled")
        await handled.put(event)

    await bus.consume(bus.subjects.all("fault"), "dl", handler, expects=(FaultDetected,))
    subject = bus.subjects.fault("j", "process")
    if payload is None:
        await bus.publish(subject, JobDeleted(source=bus.source, job="j"))
    elif payload == b"permanent":
        await bus.publish(subject, fault(bus, "poison"))
    else:
        await bus.nc.publish(subject, payload)
    letter = await asyncio.wait_for(letter_queue.get(), 10)
    assert isinstance(letter, DeadLetter)
    assert letter.reason is reason and letter.subject == subject
    assert bus.dead_letters.count(reason) == 1
    # the consumer keeps going: a good message after the bad one is handled
    good = fault(bus, "good")
    await bus.publish(subject, good)
    assert (await asyncio.wait_for(handled.get(), 10)) == good


async def test_connect_to_nothing_names_the_url() -> None:
    settings = Settings(nats_url="nats://127.0.0.1:1")
    with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:1"):
        await Bus.connect(settings, "test", connect_timeout=0.5)


async def test_instances_binding_one_new_durable_at_once_all_join_it(settings: Settings) -> None:
    """Two replicas of a service start together: both create the consumer; one is refused
    by the server and must bind to the one that won (this crashed a restarter in CI)."""
    got: asyncio.Queue[str] = asyncio.Queue()
    buses = [await Bus.connect(settings, f"replica-{i}") for i in range(2)]
    await buses[0].ensure_streams()
    try:
        for round_ in range(12):  # the race is lost only now and then: try it a few times
            durable = f"shared-{round_}"

            async def handler(event: FaultDetected, durable: str = durable) -> None:
                await got.put(f"{durable}:{event.fault_id}")

            await asyncio.gather(*(
                b.consume(b.subjects.all("fault"), durable, handler, expects=(FaultDetected,))
                for b in buses
            ))  # fmt: skip
        await buses[0].publish(buses[0].subjects.fault("j.1", "process"), fault(buses[0], "x"))
        received = sorted([await asyncio.wait_for(got.get(), 10) for _ in range(12)])
        assert received == sorted(f"shared-{r}:x" for r in range(12))  # each durable: once
    finally:
        for b in buses:
            await b.close()


async def test_closing_does_not_wait_forever_for_a_stuck_handler(settings: Settings) -> None:
    """A handler that never returns holds the drain at most DRAIN_TIMEOUT_SECONDS; the
    message stays unacked, for another instance to take."""
    from resurge.runtime.bus import DRAIN_TIMEOUT_SECONDS

    stuck = asyncio.Event()
    bus = await Bus.connect(settings, "stuck")
    await bus.ensure_streams()

    async def handler(event: FaultDetected) -> None:
        stuck.set()
        await asyncio.Event().wait()  # never returns

    await bus.consume(bus.subjects.all("fault"), "stuck", handler, expects=(FaultDetected,))
    await bus.publish(bus.subjects.fault("j.1", "process"), fault(bus))
    await asyncio.wait_for(stuck.wait(), 10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(bus.close(), DRAIN_TIMEOUT_SECONDS + 10)
    assert loop.time() - started >= DRAIN_TIMEOUT_SECONDS - 0.5  # it did wait for the handler


def forged_exit(bus: Bus, job: str, node: str) -> ProcessExited:
    return ProcessExited(
        source=bus.source, job=job, replica=0, node=node, rank=0, generation=0,
        pid=4242, local_rank=0, local_world_size=1, exit_code=None, signal="SIGKILL",
    )  # fmt: skip


@pytest.mark.parametrize("reader", ["durable", "batches", "watch"])
@pytest.mark.parametrize(
    ("subject_job", "body_job", "body_node", "named"),
    [
        ("team-a", "team-b", "node-0", "job 'team-b'"),  # another job than the subject's
        ("team-a", "team-a", "node-1", "node 'node-1'"),  # another node than the subject's
        ("_", "team-b", "node-0", "job 'team-b'"),  # a job's event on a node-level subject
    ],
)
async def test_a_raw_event_whose_body_names_another_job_or_node_is_dead_lettered(
    bus: Bus, reader: str, subject_job: str, body_job: str, body_node: str, named: str
) -> None:
    """Permissions vouch for the subject only (an agent publishes raw subjects of its own
    node, or job): a worker holding them forged a SIGKILL of another job's rank 0 by
    naming that job in the body. Every reader of raw events refuses such an event: it is
    counted and dead-lettered naming the mismatch, and the reader goes on."""
    letters = await collect(bus, bus.subjects.dlq("test"))
    handled: asyncio.Queue[Event] = asyncio.Queue()

    async def one(event: Event, _subject: str = "") -> None:
        await handled.put(event)

    async def many(events: list[Event]) -> None:
        for event in events:
            await handled.put(event)

    filter_subject = bus.subjects.raw(None, "process_exited", None)
    if reader == "durable":
        await bus.consume(filter_subject, "forged", one, expects=(ProcessExited,))
    elif reader == "batches":
        await bus.consume_batches(filter_subject, "forged", many, kind_token=4)
    else:
        await bus.subscribe(filter_subject, one)
        await bus.nc.flush()
    subject = bus.subjects.raw(subject_job, "process_exited", "node-0")
    await bus.publish(subject, forged_exit(bus, body_job, body_node))
    letter = await asyncio.wait_for(letters.get(), 10)
    assert isinstance(letter, DeadLetter)
    assert letter.reason is DeadLetterReason.SUBJECT_MISMATCH and letter.subject == subject
    assert named in letter.detail, letter.detail
    assert bus.dead_letters.count(DeadLetterReason.SUBJECT_MISMATCH) == 1
    # the reader goes on, and an event that is where its body says is handled
    good = forged_exit(bus, "team-a", "node-0")
    await bus.publish(bus.subjects.raw("team-a", "process_exited", "node-0"), good)
    assert await asyncio.wait_for(handled.get(), 10) == good
    assert handled.empty()


async def test_a_consumer_made_with_one_long_ack_wait_gets_the_short_redeliveries(
    settings: Settings,
) -> None:
    """An install upgraded from a release whose consumers waited 30 s before any
    redelivery: binding gives the existing consumer the redelivery waits of this one."""
    from resurge.runtime.bus import REDELIVER_AFTER_SECONDS

    bus = await Bus.connect(settings, "upgraded")
    await bus.ensure_streams()
    stream = bus.subjects.stream("fault")
    try:
        await bus.js.add_consumer(stream, config=ConsumerConfig(
            name="old", durable_name="old", deliver_group="old", ack_wait=30.0,
            deliver_subject=bus.nc.new_inbox(), filter_subject=bus.subjects.all("fault"),
        ))  # fmt: skip

        async def handler(event: FaultDetected) -> None:
            pass

        await bus.consume(bus.subjects.all("fault"), "old", handler, expects=(FaultDetected,))
        config = (await bus.js.consumer_info(stream, "old")).config
        assert config.backoff == list(REDELIVER_AFTER_SECONDS)
        assert config.ack_wait == REDELIVER_AFTER_SECONDS[0]
    finally:
        await bus.close()


async def test_a_slow_handler_s_message_is_not_delivered_twice(settings: Settings) -> None:
    """A handler that takes longer than the first redelivery wait keeps its message
    (the bus says it is still at work): one delivery, not one per wait."""
    from resurge.runtime.bus import REDELIVER_AFTER_SECONDS

    bus = await Bus.connect(settings, "slow")
    await bus.ensure_streams()
    deliveries: list[str] = []
    done = asyncio.Event()

    async def handler(event: FaultDetected) -> None:
        deliveries.append(event.fault_id)
        await asyncio.sleep(REDELIVER_AFTER_SECONDS[0] * 2.5)  # the work itself, not a wait
        done.set()

    try:
        await bus.consume(bus.subjects.all("fault"), "slow", handler, expects=(FaultDetected,))
        await bus.publish(bus.subjects.fault("j.1", "process"), fault(bus, "slow-1"))
        await asyncio.wait_for(done.wait(), 30)
        info = await bus.js.consumer_info(bus.subjects.stream("fault"), "slow")
        assert deliveries == ["slow-1"]
        assert info.num_redelivered == 0
    finally:
        await bus.close()
