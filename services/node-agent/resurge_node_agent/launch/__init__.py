"""``launch`` mode: one replica's launch agent (:mod:`.agent`) and what it runs its
workers with: the fork server (:mod:`.forkserver`, :mod:`.forkserver_main`,
:mod:`.spawners`), the workers and their environment (:mod:`.workers`,
:mod:`.worker_env`), the worker socket (:mod:`.worker_channel`), in-process restarts
(:mod:`.in_process`) and the rendezvous store it hosts (:mod:`.rendezvous`,
:mod:`.rendezvous_store`, :mod:`.store_probe`); its one input is the worker group
(:mod:`.group_spec`)."""
