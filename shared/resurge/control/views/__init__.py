"""Read-only views: the cluster snapshot every placement decision and view reads
(:mod:`.cluster_snapshot`), a job's history, runs, timeline and goodput read back from
the streams (:mod:`.history`, :mod:`.runs`, :mod:`.timeline`, :mod:`.goodput_meter`,
:mod:`.job_overview`), and events in words (:mod:`.event_words`)."""
