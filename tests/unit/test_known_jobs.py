"""The restarter's progress knowledge is bounded: the oldest job is forgotten first; a
deleted job is forgotten at once."""

from prometheus_client import CollectorRegistry

from resurge_restarter.known_jobs import KnownJobs


def test_the_oldest_job_is_forgotten_first_and_counted() -> None:
    registry = CollectorRegistry()
    known = KnownJobs(registry, limit=2)
    known.set_progressed("a", 1)
    known.set_progressed("b", 1)
    known.set_progressed("a", 2)  # a is the newest again
    known.set_progressed("c", 1)
    assert (known.progressed("a"), known.progressed("b"), known.progressed("c")) == (2, -1, 1)
    for job in ("a", "b", "c"):
        known.set_reports(job)
    assert [known.reports(job) for job in ("a", "b", "c")] == [False, True, True]
    assert registry.get_sample_value("resurge_restarter_known_jobs_dropped_total") == 2
    assert registry.get_sample_value("resurge_restarter_known_jobs", {"fact": "reporting"}) == 2


def test_a_deleted_job_is_forgotten_so_its_next_run_starts_from_generation_0() -> None:
    known = KnownJobs(CollectorRegistry())
    known.set_reports("j")
    known.set_progressed("j", 5)
    known.set_reached("j", 5, 300)
    known.forget("j")  # deleted; submitted again, its generation 0 is new
    assert not known.reports("j") and known.progressed("j") == -1
    assert known.reached("j", 5) is None
    known.set_reached("j", 0, 3)
    assert known.reached("j", 0) == 3
