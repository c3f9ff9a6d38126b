"""What the control plane's services share: job records, the rank planner, the
messages sent about a job, the worker groups a record asks for, node views, and the
client API the CLI and tests use."""
