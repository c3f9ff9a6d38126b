"""resurge: resilience and elasticity for distributed PyTorch training.

The shared library every service imports: event models, subjects, the bus, job spec
and records, the rank planner, settings, logging, metrics and the service runner.
Services import this package and never each other.
"""

__version__ = "0.1.0"
