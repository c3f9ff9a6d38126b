"""resurge: resilience and elasticity for distributed PyTorch training.

The shared library every service imports, in layers (each imports only those below it;
pyproject.toml's import-linter contract says so): ``cli`` (the ``resurge`` command),
``local`` (the embedded local cluster, the demo, the job factory), ``detection`` (the
detector plugin API), ``control`` (job records, rank planner, messages about a job,
client), ``cluster`` (the backend protocol and the local backend), ``runtime`` (bus,
service runner, settings, logs, metrics), ``events``, ``jobspec``, ``contract``
(subjects, vocabulary, XIDs) and ``worker`` (the standard-library worker library).
Services import this package and never each other.
"""

__version__ = "0.1.0"
