from resurge.cluster.names import worker_hostname
from resurge.control.decisions.planner import (
    WHOLE_TABLE_REPLICAS,
    assignments,
    command_id,
    master_port_for,
)
from resurge.control.decisions.worker_groups import worker_group
from resurge.control.state.records import CheckpointRef, JobRecord, Placement
from resurge.events import Assign, Source, decode_event, encode_event
from resurge.local import job_factory
from resurge_node_agent.launch.worker_env import worker_environment

SOURCE = Source(service="test", instance="here:1")


def record(replicas: int, nproc: int, generation: int = 0) -> JobRecord:
    job = job_factory.job("j", nproc=nproc, preload=None)
    return JobRecord(
        name="j",
        spec=job,
        generation=generation,
        placements=[Placement(replica=r, node=f"n{r}") for r in range(replicas)],
        master_port=master_port_for("j", generation),
    )


def test_ranks_are_laid_out_replica_by_replica() -> None:
    assigns = assignments(record(replicas=3, nproc=2), SOURCE)
    assert [a.replica for a in assigns] == [0, 1, 2]
    ranks = sorted(int(worker_environment(a, lr)["RANK"]) for a in assigns for lr in range(2))
    assert ranks == list(range(6))
    env = worker_environment(assigns[1], 1)
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1"
    assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "2"
    assert env["RESURGE_GENERATION"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"


def test_each_generation_gets_a_fresh_port_in_range() -> None:
    ports = [master_port_for("j", g) for g in range(50)]
    assert len(set(ports)) == 50
    assert all(20000 <= p < 32000 for p in ports)
    assert master_port_for("j", 0, "uid-1") != master_port_for("j", 0, "uid-2")


def test_assign_carries_the_resume_point_into_the_worker_environment() -> None:
    rec = record(replicas=1, nproc=1, generation=2)
    rec.latest_checkpoint = CheckpointRef(step=40, path="/ckpt/step-00000040")
    [assign] = assignments(rec, SOURCE)
    assert (assign.resume_checkpoint, assign.resume_step) == ("/ckpt/step-00000040", 40)
    env = worker_environment(assign, 0)
    assert env["RESURGE_RESUME_CHECKPOINT"] == "/ckpt/step-00000040"
    assert env["RESURGE_RESUME_STEP"] == "40" and env["RESURGE_GENERATION"] == "2"


def test_a_job_submitted_again_under_its_name_gets_commands_of_its_own() -> None:
    first, again = (
        command_id("assign", "j", 0, 0, "uid-1"),
        command_id("assign", "j", 0, 0, "uid-2"),
    )
    assert first != again, "JetStream would drop the new record's commands as repeats"
    assert first == command_id("assign", "j", 0, 0, "uid-1")


def test_a_small_job_s_assigns_carry_the_whole_rank_table() -> None:
    assigns = assignments(record(replicas=WHOLE_TABLE_REPLICAS, nproc=2), SOURCE)
    assert all(len(a.rank_table) == WHOLE_TABLE_REPLICAS for a in assigns)
    assert all(a.replicas == WHOLE_TABLE_REPLICAS and a.whole_table for a in assigns)


def test_a_large_job_s_assigns_carry_their_own_slot_and_the_count() -> None:
    replicas = WHOLE_TABLE_REPLICAS + 1
    assigns = assignments(record(replicas=replicas, nproc=2), SOURCE)
    assert [[s.replica for s in a.rank_table] for a in assigns] == [[r] for r in range(replicas)]
    last = assigns[-1]
    decoded = decode_event(encode_event(last))  # what an agent reads off the bus
    assert isinstance(decoded, Assign) and not decoded.whole_table
    env = worker_environment(decoded, 1)
    assert env["GROUP_WORLD_SIZE"] == str(replicas) and env["GROUP_RANK"] == str(replicas - 1)
    assert env["RANK"] == str(2 * replicas - 1) and env["WORLD_SIZE"] == str(2 * replicas)
    assert len(encode_event(last)) < 1_000  # not the whole table's 65 slots


def test_an_assign_without_the_count_counts_its_rank_table() -> None:
    [assign] = assignments(record(replicas=1, nproc=1), SOURCE)
    older = assign.model_copy(update={"replicas": None})  # as sent before the count existed
    assert older.group_world_size == 1 and older.whole_table


def test_on_the_pod_network_master_addr_is_replica_0s_pod_dns_name() -> None:
    """A record with a worker domain (Kubernetes pod networking) rendezvouses at replica
    0's worker group's DNS name, which follows its node and incarnation; without one, at
    its node's address."""
    rec = record(replicas=2, nproc=1)
    rec.placements = [Placement(replica=r, node=f"n{r}", address=f"10.0.0.{r}") for r in (0, 1)]
    assert {a.master_addr for a in assignments(rec, SOURCE)} == {"10.0.0.0"}

    rec.worker_domain = "j.team.svc"
    first = {a.master_addr for a in assignments(rec, SOURCE)}
    group = worker_group(rec, rec.placements[0])
    assert first == {f"{worker_hostname(group)}.j.team.svc"}

    rec.incarnations = {0: 1}  # replica 0's pod recreated: a new pod, a new name
    again = {a.master_addr for a in assignments(rec, SOURCE)}
    assert len(again) == 1 and again != first
    assert again == {f"{worker_hostname(worker_group(rec, rec.placements[0]))}.j.team.svc"}
