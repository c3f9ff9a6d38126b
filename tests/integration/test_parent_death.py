"""The parent-death signal's start-up race, against real processes.

A process whose parent died before it asked for the signal would never get it: it
must notice and exit at once instead of living on as an orphan.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from resurge_node_agent.launch.forkserver import SERVER_MODULE

SECONDS = 30


def reaped_pid() -> int:
    """The pid of a process that has exited and been reaped (the parent it stood for is gone)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=SECONDS
    )


def test_a_process_whose_parent_is_alive_lives_on() -> None:
    done = run(
        "import os\n"
        "from resurge_node_agent.launch.parent_death import die_with_parent\n"
        "die_with_parent(os.getppid()); print('alive')\n"
    )
    assert (done.returncode, done.stdout) == (0, "alive\n"), done.stderr


def test_a_process_whose_parent_already_died_exits_at_once() -> None:
    # Its parent is not the pid it names: as if that parent had died before the request.
    done = run(
        "from resurge_node_agent.launch.parent_death import die_with_parent\n"
        f"die_with_parent({reaped_pid()}); print('alive')\n"
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr


def test_a_fork_server_whose_agent_already_died_exits_before_it_is_ready() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        argv = [sys.executable, "-m", SERVER_MODULE, str(theirs.fileno()), str(reaped_pid())]
        server = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        assert server.wait(SECONDS) == 1
        ours.settimeout(SECONDS)
        assert ours.recv(1) == b""  # no ready frame: it never preloaded nor served
