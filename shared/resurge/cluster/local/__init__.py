"""The local backend (:mod:`.backend`): nodes, worker groups and job statuses as records
in the bus's KV buckets (:mod:`.keys`), and the watch of their changes (:mod:`.watch`),
which the Kubernetes backend keeps its worker-group records with too."""
