"""``monitor`` mode: one node's monitor (:mod:`.node_monitor`): its reports and
heartbeat, the launch agents of the worker groups placed on it, and its GPUs
(:mod:`.gpus`: NVML, or simulated ones)."""
