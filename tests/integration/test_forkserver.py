"""Spawners against real processes: the fork server and plain subprocesses are interchangeable.

Every behavioural test runs against both :class:`PlainSpawner` and a
:class:`ForkServerSpawner` preloading ``json`` (fast to start). Tests that must know
which way a worker went compare its parent pid with the fork server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from resurge_node_agent.launch.forkserver import (
    STARTUP_PREFIXES,
    ForkServerSpawner,
    PythonProgram,
    python_program,
    startup_mismatch,
)
from resurge_node_agent.launch.spawners import PlainSpawner, SpawnedProcess, Spawner

PY = sys.executable
SECONDS = 30
SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"


def worker_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(params=["plain", "forkserver"])
async def spawner(request: pytest.FixtureRequest) -> AsyncIterator[Spawner]:
    made: Spawner = (
        PlainSpawner()
        if request.param == "plain"
        else await ForkServerSpawner.start(preload=("json",))
    )
    yield made
    await made.close()


async def lines(reader: asyncio.StreamReader) -> list[str]:
    data = await asyncio.wait_for(reader.read(), SECONDS)
    return data.decode().splitlines()


async def finish(proc: SpawnedProcess) -> tuple[list[str], list[str], int]:
    out, err = await asyncio.gather(lines(proc.stdout), lines(proc.stderr))
    code = await asyncio.wait_for(proc.wait(), SECONDS)
    return out, err, code


async def run(
    spawner: Spawner, argv: list[str], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> tuple[list[str], list[str], int]:
    return await finish(await spawner.spawn(argv, worker_env() if env is None else env, cwd))


async def next_line(proc: SpawnedProcess) -> str:
    return (await asyncio.wait_for(proc.stdout.readline(), SECONDS)).decode().rstrip("\n")


def expected_parent(spawner: Spawner) -> int:
    """The pid a forked worker's parent has: the server's; a plain one's: ours."""
    if isinstance(spawner, ForkServerSpawner):
        assert spawner.server_pid is not None
        return spawner.server_pid
    return os.getpid()


async def test_stdout_and_stderr_lines_arrive_separately(spawner: Spawner) -> None:
    code = (
        "import sys\n"
        "for i in range(3):\n"
        "    print(f'out {i}', flush=True)\n"
        "    print(f'err {i}', file=sys.stderr, flush=True)\n"
    )
    out, err, rc = await run(spawner, [PY, "-c", code])
    assert (out, err, rc) == (["out 0", "out 1", "out 2"], ["err 0", "err 1", "err 2"], 0)


async def test_child_sees_exactly_env_cwd_and_argv(spawner: Spawner, tmp_path: Path) -> None:
    # The locale and interpreter variables stay: without them a fresh interpreter would
    # coerce the locale and add LC_CTYPE itself.
    env = {k: v for k, v in os.environ.items() if k.startswith(STARTUP_PREFIXES)}
    env |= {"PATH": os.defpath, "OMP_NUM_THREADS": "1", "ONLY_HERE": "yes"}
    code = (
        "import json, os, sys\n"
        "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), 'argv': sys.argv,"
        " 'ppid': os.getppid()}))\n"
    )
    out, err, rc = await run(spawner, [PY, "-c", code, "a", "b c"], env, str(tmp_path))
    assert (err, rc) == ([], 0)
    seen = json.loads(out[0])
    assert seen["env"] == env
    assert seen["cwd"] == str(tmp_path)
    assert seen["argv"] == ["-c", "a", "b c"]
    assert seen["ppid"] == expected_parent(spawner)


async def test_module_script_and_code_forms(spawner: Spawner, tmp_path: Path) -> None:
    report = "import sys; print(__name__, sys.argv, sys.path[0])\n"
    (tmp_path / "fs_mod_here.py").write_text(report)
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "script.py"
    script.write_text(report + "raise SystemExit(0)\n")
    cwd = str(tmp_path)

    out, _, rc = await run(spawner, [PY, "-m", "fs_mod_here", "x"], cwd=cwd)
    assert rc == 0
    assert out == [f"__main__ {[str(tmp_path / 'fs_mod_here.py'), 'x']} {tmp_path}"]

    out, _, rc = await run(spawner, [PY, "sub/script.py", "y"], cwd=cwd)
    assert rc == 0
    assert out == [f"__main__ {['sub/script.py', 'y']} {tmp_path / 'sub'}"]

    out, _, rc = await run(spawner, [PY, "-c", report, "z"], cwd=cwd)
    assert rc == 0
    assert out == [f"__main__ {['-c', 'z']} "]


@pytest.mark.parametrize(
    ("code", "returncode", "last_err"),
    [
        ("pass", 0, None),
        ("import sys; sys.exit(3)", 3, None),
        ("raise SystemExit('bye')", 1, "bye"),
        ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ],
)
async def test_exit_codes(
    spawner: Spawner, code: str, returncode: int, last_err: str | None
) -> None:
    proc = await spawner.spawn([PY, "-c", code], worker_env(), None)
    _, err, rc = await finish(proc)
    assert rc == returncode
    assert proc.returncode == returncode
    assert (err[-1] if err else None) == last_err


async def test_uncaught_exception_exits_1_with_a_traceback(spawner: Spawner) -> None:
    out, err, rc = await run(spawner, [PY, "-c", "print('before')\nraise ValueError('boom')"])
    assert (out, rc) == (["before"], 1)
    assert err == [
        "Traceback (most recent call last):",
        '  File "<string>", line 2, in <module>',
        "ValueError: boom",
    ]


async def test_missing_script_and_module_exit_as_python_would(
    spawner: Spawner, tmp_path: Path
) -> None:
    _, err, rc = await run(spawner, [PY, "absent.py"], cwd=str(tmp_path))
    assert rc == 2
    where = str(tmp_path / "absent.py")
    assert err == [f"{PY}: can't open file {where!r}: [Errno 2] No such file or directory"]
    _, err, rc = await run(spawner, [PY, "-m", "resurge_no_such_module"])
    assert (err, rc) == ([f"{PY}: No module named resurge_no_such_module"], 1)


async def test_shutdown_joins_threads_then_runs_atexit(spawner: Spawner) -> None:
    code = (
        "import atexit, threading, time\n"
        "atexit.register(print, 'atexit', flush=True)\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread', flush=True))).start()\n"
    )
    out, _, rc = await run(spawner, [PY, "-c", code])
    assert (out, rc) == (["thread", "atexit"], 0)


async def test_sigkill_to_the_process_group_reports_minus_9(spawner: Spawner) -> None:
    proc = await spawner.spawn([PY, "-c", SLEEPER], worker_env(), None)
    assert await next_line(proc) == "ready"
    assert proc.returncode is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), SECONDS) == -signal.SIGKILL
    assert proc.returncode == -signal.SIGKILL


async def test_the_child_leads_its_own_process_group_and_session(spawner: Spawner) -> None:
    proc = await spawner.spawn([PY, "-c", SLEEPER], worker_env(), None)
    assert await next_line(proc) == "ready"
    try:
        assert os.getpgid(proc.pid) == proc.pid
        assert os.getsid(proc.pid) == proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), SECONDS) == -signal.SIGTERM


async def test_unbuffered_flag_streams_lines_while_running(spawner: Spawner) -> None:
    env = worker_env()
    env.pop("PYTHONUNBUFFERED", None)
    proc = await spawner.spawn(
        [PY, "-u", "-c", "import time; print('ready'); time.sleep(60)"], env, None
    )
    assert await next_line(proc) == "ready"
    assert proc.returncode is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), SECONDS) == -signal.SIGKILL


async def test_non_python_argv_runs_as_a_plain_subprocess(spawner: Spawner) -> None:
    out, _, rc = await run(spawner, ["/bin/echo", "hi"])
    assert (out, rc) == (["hi"], 0)
    out, _, rc = await run(spawner, ["/bin/sh", "-c", "echo $PPID"])
    assert (out, rc) == ([str(os.getpid())], 0)


async def test_unsupported_flags_and_startup_variables_run_as_plain_subprocesses(
    spawner: Spawner,
) -> None:
    ppid = "import os; print(os.getppid())"
    out, _, rc = await run(spawner, [PY, "-X", "dev", "-c", ppid])
    assert (out, rc) == ([str(os.getpid())], 0)
    hashseed = worker_env(PYTHONHASHSEED=str(int(os.environ.get("PYTHONHASHSEED", "0")) + 1))
    out, _, rc = await run(spawner, [PY, "-c", ppid], hashseed)
    assert (out, rc) == ([str(os.getpid())], 0)


async def test_missing_cwd_raises_file_not_found(spawner: Spawner, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await spawner.spawn([PY, "-c", "pass"], worker_env(), str(tmp_path / "absent"))


async def test_concurrent_spawns_each_get_their_own_pipes(spawner: Spawner) -> None:
    procs = await asyncio.gather(
        *(
            spawner.spawn([PY, "-c", f"print({i}); raise SystemExit({i})"], worker_env(), None)
            for i in range(4)
        )
    )
    results = await asyncio.gather(*(finish(p) for p in procs))
    assert [(out, rc) for out, _, rc in results] == [([str(i)], i) for i in range(4)]
    assert len({p.pid for p in procs}) == 4


async def test_close_kills_workers_still_running(spawner: Spawner) -> None:
    proc = await spawner.spawn([PY, "-c", SLEEPER], worker_env(), None)
    assert await next_line(proc) == "ready"
    await spawner.close()
    assert await asyncio.wait_for(proc.wait(), SECONDS) == -signal.SIGKILL
    assert await lines(proc.stdout) == []


# Fork server only.


async def test_preloaded_torch_runs_in_a_forked_worker() -> None:
    spawner = await ForkServerSpawner.start(preload=("torch",))
    try:
        assert spawner.preload_failures == {}
        code = (
            "import os, sys\n"
            "assert 'torch' in sys.modules, 'not preloaded'\n"
            "import torch\n"
            "print((torch.ones(3) * 2).sum().item(), torch.get_num_threads(),"
            " torch.cuda.is_initialized(), os.getppid())\n"
        )
        out, err, rc = await run(spawner, [PY, "-c", code])
        assert (err, rc) == ([], 0)
        assert out == [f"6.0 1 False {spawner.server_pid}"]
    finally:
        await spawner.close()


async def test_a_preload_module_that_fails_is_reported_not_fatal() -> None:
    spawner = await ForkServerSpawner.start(preload=("json", "resurge_no_such_module"))
    try:
        assert list(spawner.preload_failures) == ["resurge_no_such_module"]
        out, _, rc = await run(spawner, [PY, "-c", "import os; print(os.getppid())"])
        assert (out, rc) == ([str(spawner.server_pid)], 0)
    finally:
        await spawner.close()


async def test_server_death_kills_its_workers_and_the_next_spawn_restarts_it() -> None:
    spawner = await ForkServerSpawner.start(preload=("json",))
    try:
        proc = await spawner.spawn([PY, "-c", SLEEPER], worker_env(), None)
        assert await next_line(proc) == "ready"
        first = spawner.server_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), SECONDS) == -signal.SIGKILL
        assert await lines(proc.stdout) == []  # every writer end is closed: it is gone
        assert spawner.server_pid is None
        out, _, rc = await run(spawner, [PY, "-c", "import os; print(os.getppid())"])
        assert spawner.server_pid not in (None, first)
        assert (out, rc) == ([str(spawner.server_pid)], 0)
    finally:
        await spawner.close()


async def test_after_max_restarts_workers_run_as_plain_subprocesses() -> None:
    spawner = await ForkServerSpawner.start(preload=("json",), max_restarts=0)
    try:
        server = spawner.server_pid
        assert server is not None
        os.kill(server, signal.SIGKILL)
        out, _, rc = await run(spawner, [PY, "-c", "import os; print(os.getppid())"])
        assert (out, rc) == ([str(os.getpid())], 0)
        assert spawner.server_pid is None
    finally:
        await spawner.close()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([PY, "-c", "x", "a"], PythonProgram("code", "x", ("a",), False)),
        ([PY, "-u", "-m", "pkg.mod"], PythonProgram("module", "pkg.mod", (), True)),
        ([PY, "train.py", "-m", "x"], PythonProgram("path", "train.py", ("-m", "x"), False)),
        ([PY], None),
        ([PY, "-"], None),
        ([PY, "-X", "dev", "t.py"], None),
        ([PY, "-mpkg"], None),
        (["/bin/echo", "hi"], None),
        (["/usr/bin/python3", "t.py"], None),
        (["python2", "t.py"], None),
        ([], None),
    ],
)
def test_python_program(argv: list[str], expected: PythonProgram | None) -> None:
    env = {"PATH": os.defpath}
    assert python_program(argv, env, None) == expected


def test_a_bare_python_name_counts_only_from_this_interpreters_folder() -> None:
    here = str(Path(PY).parent)
    assert python_program(["python3", "t.py"], {"PATH": here}, None) is not None
    assert python_program(["python3", "t.py"], {"PATH": "/nonexistent"}, None) is None
    relative = os.path.relpath(Path(PY).parent / "python3", "/")
    assert python_program([relative, "t.py"], {}, "/") is not None
    assert python_program(["python3", "t.py"], {"PYTHONUNBUFFERED": "1", "PATH": here}, None) == (
        PythonProgram("path", "t.py", (), True)
    )


def test_startup_mismatch() -> None:
    server = {"PYTHONPATH": "/a", "LANG": "C.UTF-8", "HOME": "/root"}
    assert startup_mismatch({**server, "RANK": "3", "HOME": "/x"}, server) is None
    assert startup_mismatch({**server, "PYTHONUNBUFFERED": "1"}, server) is None
    assert startup_mismatch({**server, "OMP_NUM_THREADS": "2"}, server) is None
    assert startup_mismatch({**server, "OMP_NUM_THREADS": "0"}, server) == "OMP_NUM_THREADS"
    assert startup_mismatch({**server, "PYTHONPATH": "/b"}, server) == "PYTHONPATH"
    assert startup_mismatch({"LANG": "C.UTF-8", "HOME": "/root"}, server) == "PYTHONPATH"
    assert startup_mismatch({**server, "LD_PRELOAD": "x.so"}, server) == "LD_PRELOAD"


async def test_a_fork_server_dies_with_the_agent_that_started_it(tmp_path: Path) -> None:
    """However its agent dies (here SIGKILL, which runs no clean-up), the server goes too,
    even while another process still holds the agent's end of their socket (a forked
    child of the agent here), so the server never sees it close."""
    agent_code = (
        "import asyncio, os, time\n"
        "from resurge_node_agent.launch.forkserver import ForkServerSpawner\n"
        "async def main():\n"
        "    spawner = await ForkServerSpawner.start(preload=('json',))\n"
        "    if os.fork() == 0:\n"
        "        os.close(1)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    print(spawner.server_pid, flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    agent = await asyncio.create_subprocess_exec(
        PY,
        "-c",
        agent_code,
        stdout=asyncio.subprocess.PIPE,
        env=worker_env(),
        start_new_session=True,
    )
    assert agent.stdout is not None
    server_pid = int(await asyncio.wait_for(agent.stdout.readline(), SECONDS))
    server = os.pidfd_open(server_pid)
    try:
        agent.kill()
        readable, _, _ = await asyncio.to_thread(select.select, [server], [], [], 10)
        assert readable == [server], "the fork server outlived its agent"
    finally:
        os.close(server)
        os.killpg(agent.pid, signal.SIGKILL)  # the agent's forked child
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGKILL)  # only if the test failed
        await agent.wait()
