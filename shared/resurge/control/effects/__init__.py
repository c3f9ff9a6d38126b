"""What changes the cluster or the bus: the client API the CLI and tests use
(:mod:`.client`), the commands and phase changes sent about a job
(:mod:`.job_messages`), a finished job's last steps carried out (:mod:`.job_finish`),
and nodes listed, cordoned and uncordoned (:mod:`.nodes`)."""
