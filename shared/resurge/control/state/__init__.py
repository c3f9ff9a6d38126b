"""Stored state: the job records (:mod:`.records`, one KV entry per job, changed by
compare-and-set), a record read whatever version wrote it (:mod:`.record_entries`), and
the allocation ledger every placer claims slots in (:mod:`.allocations`)."""
