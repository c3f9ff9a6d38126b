"""resurge-loss-spike: a detector plugin that restarts a worker whose loss spikes.

Registered in the entry-point group ``resurge.detectors`` as ``loss_spike`` (see this
package's pyproject.toml); the detector service loads it once the package is installed.
"""

from resurge_loss_spike.detector import (
    FACTOR_ENV,
    METRIC_ENV,
    WARMUP_ENV,
    WINDOW_ENV,
    LossSpikeDetector,
)

__all__ = ["FACTOR_ENV", "METRIC_ENV", "WARMUP_ENV", "WINDOW_ENV", "LossSpikeDetector"]
