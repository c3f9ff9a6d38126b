"""The detector service's settings: which detectors, which partition, how often to tick.

``RESURGE_DETECTORS`` (``all`` or a comma-separated list of entry-point names),
``RESURGE_DETECTOR_REPLICAS`` and ``RESURGE_DETECTOR_INDEX`` (several replicas share the
jobs by a hash of the job name), ``RESURGE_DETECTOR_TICK_SECONDS``, beside the common
settings of :class:`~resurge.runtime.settings.Settings`.
"""

from __future__ import annotations

from pydantic import Field

from resurge.detection import available_detectors
from resurge.runtime.settings import Settings

__all__ = ["DetectorSettings"]


class DetectorSettings(Settings):
    """The common settings plus the detector service's own."""

    detectors: str = Field(
        default="all", description="'all' registered detectors, or a comma-separated list."
    )
    detector_replicas: int = Field(default=1, ge=1, description="Detector replicas in all.")
    detector_index: int = Field(default=0, ge=0, description="This replica's index.")
    detector_tick_seconds: float = Field(
        default=0.1, gt=0, description="How often detectors judge silences and windows."
    )

    def detector_names(self) -> list[str]:
        """The detectors to run: every registered one for ``all``, else those listed."""
        if self.detectors.strip() == "all":
            return sorted(available_detectors())
        return [n.strip() for n in self.detectors.split(",") if n.strip()]
