"""What the control plane's services share, by role: pure decisions
(:mod:`.decisions`), stored state (:mod:`.state`), read-only views (:mod:`.views`) and
what changes the cluster or the bus (:mod:`.effects`); each imports only the roles
listed after it."""
