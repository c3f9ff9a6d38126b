"""An agent's command inbox against a real nats-server: commands published before it
started, while it was cut off from the server, twice, and across a restart of the agent.

The agent's connection runs through a TCP relay the test can cut and restore: the
server stays up (the test publishes meanwhile) while the agent is disconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from resurge.events import Assign, ReplicaSlot, Stop, encode_event
from resurge.runtime.bus import Bus
from resurge.runtime.command_inbox import CommandInbox, position_key
from resurge.runtime.settings import Settings

WAIT = 10.0


class Relay:
    """A TCP relay to the server; :meth:`cut` drops every connection through it and
    refuses new ones until :meth:`restore`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def restore(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.close()
        await self.server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}


class Commands:
    """What a handler was given, awaitable."""

    def __init__(self) -> None:
        self.got: list[Assign | Stop] = []
        self.came = asyncio.Condition()

    async def handle(self, command: Assign | Stop) -> None:
        async with self.came:
            self.got.append(command)
            self.came.notify_all()

    async def wait_for(self, count: int) -> list[Assign | Stop]:
        async with self.came:
            await asyncio.wait_for(self.came.wait_for(lambda: len(self.got) >= count), WAIT)
        return self.got


def assign(bus: Bus, job: str, generation: int) -> Assign:
    return Assign(
        source=bus.source,
        job=job,
        replica=0,
        generation=generation,
        rank_table=[ReplicaSlot(replica=0, node="node-0", nproc=1, first_rank=0)],
        world_size=1,
        master_addr="127.0.0.1",
        master_port=29500,
    )


@contextlib.asynccontextmanager
async def inbox(
    bus: Bus, job: str, commands: Commands, key: str | None = None
) -> AsyncIterator[CommandInbox]:
    box = CommandInbox(
        bus, bus.subjects.cmd(job, 0), commands.handle, expects=(Assign, Stop), position_key=key
    )
    await box.start()
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture
def job() -> str:
    return f"job-{uuid.uuid4().hex[:6]}"


async def test_a_new_agent_starts_from_the_newest_command_published_before_it(
    bus: Bus, job: str
) -> None:
    subject = bus.subjects.cmd(job, 0)
    for generation in (1, 2):
        await bus.publish(subject, assign(bus, job, generation))
    commands = Commands()
    async with inbox(bus, job, commands):
        [first] = await commands.wait_for(1)
        assert isinstance(first, Assign) and first.generation == 2  # 1 is superseded
        await bus.publish(subject, assign(bus, job, 3))
        got = await commands.wait_for(2)
    assert [c.generation for c in got] == [2, 3]


async def test_a_repeated_command_is_acted_on_once(bus: Bus, job: str) -> None:
    subject = bus.subjects.cmd(job, 0)
    commands = Commands()
    async with inbox(bus, job, commands):
        first = assign(bus, job, 1)
        await bus.publish(subject, first)
        await bus.publish(subject, first)  # a publisher's retry: stored once
        await bus.nc.publish(subject, encode_event(first))  # live only: core NATS again
        await bus.publish(subject, assign(bus, job, 2))  # comes after the repeats
        got = await commands.wait_for(2)  # handed over in order: the repeats went first
    assert [c.generation for c in got] == [1, 2]


async def test_commands_sent_while_the_agent_was_cut_off_are_acted_on(
    settings: Settings, bus: Bus, job: str
) -> None:
    host, port = settings.nats_url.rsplit("//", 1)[1].rsplit(":", 1)
    relay = Relay(host, int(port))
    await relay.restore()
    agent = await Bus.connect(
        settings.model_copy(update={"nats_url": f"nats://127.0.0.1:{relay.port}"}), "agent"
    )
    links: asyncio.Queue[bool] = asyncio.Queue()
    agent.on_connection_change(links.put_nowait)
    commands = Commands()
    subject = bus.subjects.cmd(job, 0)
    try:
        async with inbox(agent, job, commands):
            await bus.publish(subject, assign(bus, job, 1))
            await commands.wait_for(1)
            await relay.cut()
            assert await asyncio.wait_for(links.get(), WAIT) is False
            await bus.publish(subject, assign(bus, job, 2))  # nobody there to hear it live
            stop = Stop(source=bus.source, job=job, replica=0, generation=2, reason="test")
            await bus.publish(subject, stop)
            await relay.restore()
            got = await commands.wait_for(3)
    finally:
        await agent.close()
        with contextlib.suppress(Exception):
            await relay.cut()
    assert [(c.kind, c.generation) for c in got] == [("assign", 1), ("assign", 2), ("stop", 2)]


async def test_an_agent_started_again_goes_on_after_the_last_command_it_handled(
    bus: Bus, job: str
) -> None:
    subject = bus.subjects.cmd(job, 0)
    key = position_key("node-0", job, 0, 0)
    before = Commands()
    async with inbox(bus, job, before, key):
        await bus.publish(subject, assign(bus, job, 1))
        await before.wait_for(1)
    # Down: two commands, and the newest alone would lose the Assign.
    await bus.publish(subject, assign(bus, job, 2))
    await bus.publish(subject, Stop(source=bus.source, job=job, replica=0, generation=1))
    again = Commands()
    async with inbox(bus, job, again, key):
        got = await again.wait_for(2)
    assert [(c.kind, c.generation) for c in got] == [("assign", 2), ("stop", 1)]
    # Another incarnation (a new agent) starts from the newest command only.
    fresh = Commands()
    async with inbox(bus, job, fresh, position_key("node-0", job, 0, 1)):
        [newest] = await fresh.wait_for(1)
    assert (newest.kind, newest.generation) == ("stop", 1)


async def test_a_new_run_s_first_agent_starts_from_the_newest_command_not_the_old_position(
    bus: Bus, job: str
) -> None:
    # The old run's first agent (node-0, incarnation 0) handled generation 1 and went away;
    # its run went on, and was deleted.
    subject = bus.subjects.cmd(job, 0)
    old = Commands()
    async with inbox(bus, job, old, position_key("node-0", job, 0, 0, "old-run")):
        await bus.publish(subject, assign(bus, job, 1))
        await old.wait_for(1)
    await bus.publish(subject, assign(bus, job, 2))
    await bus.publish(
        subject, Stop(source=bus.source, job=job, replica=0, generation=2, final=True)
    )
    # The new run's first agent: the same node and incarnation, another run.
    new = Commands()
    async with inbox(bus, job, new, position_key("node-0", job, 0, 0, "new-run")):
        await new.wait_for(1)
        await bus.publish(subject, assign(bus, job, 0))
        got = await new.wait_for(2)
    assert [(c.kind, c.generation) for c in got] == [("stop", 2), ("assign", 0)]


async def test_a_stored_message_that_is_no_command_is_dead_lettered_once(
    bus: Bus, job: str
) -> None:
    letters: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_letter(msg: Msg) -> None:
        letters.put_nowait(msg.data)

    await bus.nc.subscribe(bus.subjects.dlq(bus.service), cb=on_letter)
    subject = bus.subjects.cmd(job, 0)
    commands = Commands()
    box = CommandInbox(bus, subject, commands.handle, expects=(Assign,), recheck_seconds=0.05)
    await box.start()
    try:
        await bus.js.publish(subject, b"not an event")  # live: skipped; stored: dead-lettered
        await bus.publish(subject, assign(bus, job, 1))
        await commands.wait_for(1)
        first = await asyncio.wait_for(letters.get(), WAIT)
        # Later checks read on from after it: the next command is handled, not the letter.
        await bus.publish(subject, assign(bus, job, 2))
        await commands.wait_for(2)
    finally:
        await box.close()
    assert b"not an event" in first
    assert letters.empty()
