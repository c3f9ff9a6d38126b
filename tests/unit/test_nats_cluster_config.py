"""A local NATS cluster's make-up: each server its own data folder, ports and name, routed
to the others; the supervisor's parties told to keep three copies of each stream."""

from __future__ import annotations

from pathlib import Path

from resurge.local.nats_server import cluster_of
from resurge.local.supervisor import Supervisor


def test_three_servers_each_routed_to_the_other_two(tmp_path: Path) -> None:
    servers = cluster_of(tmp_path, 3, None, "nats")
    names = [s.cluster.name for s in servers if s.cluster]
    assert names == ["server-0", "server-1", "server-2"]
    assert len({s.state_dir for s in servers}) == 3 and len({s.port for s in servers}) == 3
    routes = {s.cluster.port for s in servers if s.cluster}
    for server in servers:
        assert server.cluster is not None
        assert set(server.cluster.peers) == routes - {server.cluster.port}
        config = server.cluster.config(server.host)
        assert f'server_name: "{server.cluster.name}"' in config
        assert 'name: "resurge"' in config


def test_the_supervisor_asks_for_three_copies_on_a_cluster_and_one_alone(tmp_path: Path) -> None:
    alone = Supervisor(tmp_path / "a", nats_url="nats://127.0.0.1:4222")
    cluster = Supervisor(tmp_path / "b", nats_url="nats://127.0.0.1:4222", nats_servers=3)
    assert alone.settings().stream_replicas == 1 and alone.env()["RESURGE_STREAM_REPLICAS"] == "1"
    assert cluster.settings().stream_replicas == 3
    assert cluster.env()["RESURGE_STREAM_REPLICAS"] == "3"
