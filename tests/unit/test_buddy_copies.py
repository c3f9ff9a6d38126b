"""Buddy copies (resurge.worker.buddy) over real TCP on this machine: a copy with the
generation's token is kept in the buddy's folder; one without it is refused; one past the
buddy's memory budget is refused with the reason, which the sender says once."""

from __future__ import annotations

from pathlib import Path

import pytest

from resurge.worker.buddy import Buddy, BuddyServer, new_token, send_copy
from resurge.worker.live_copy import Held, shard_key
from resurge.worker.snapshot_folder import SnapshotFolder


def test_a_copy_is_kept_refused_without_the_token_and_refused_past_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = BuddyServer(SnapshotFolder(tmp_path / "buddy", budget=3000))
    token = new_token()
    server.accept_token(token)
    snapshot = tmp_path / "step-00000007.snap"
    snapshot.write_bytes(b"s" * 2000)
    key = shard_key(1, 2)
    try:
        assert send_copy(Buddy(0, "127.0.0.1", server.port, token), key, 7, snapshot)
        assert server.folder.held() == [Held(key, 7)]
        assert server.folder.path(key, 7).read_bytes() == b"s" * 2000

        assert not send_copy(Buddy(0, "127.0.0.1", server.port, new_token()), key, 8, snapshot)
        assert server.folder.held() == [Held(key, 7)] and server.refused == 1

        # 2000 more do not fit beside 2000 in 3000: the buddy keeps step 7 and says why.
        buddy = Buddy(0, "127.0.0.1", server.port, token)
        assert not send_copy(buddy, key, 8, snapshot)
        assert not send_copy(buddy, key, 9, snapshot)
        assert server.folder.held() == [Held(key, 7)] and server.refused == 3
        said = [line for line in capsys.readouterr().err.splitlines() if "was not kept" in line]
        assert len(said) == 2, said  # the wrong token's, then the budget's once
        assert "refused: not this generation's token" in said[0]
        assert "2000 bytes do not fit in the snapshot memory budget of 3000 bytes" in said[1]
    finally:
        server.close()
