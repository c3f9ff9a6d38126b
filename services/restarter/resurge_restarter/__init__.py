"""resurge restarter: recovers jobs from faults by starting a new generation."""
