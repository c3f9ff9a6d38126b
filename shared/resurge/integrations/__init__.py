"""``resurge.integrations``: resurge's worker library inside training frameworks.

Each module here runs in the training process and imports its framework (and torch) at
the top, so import it only from a training script: :mod:`resurge.integrations.lightning`
for PyTorch Lightning. They use :mod:`resurge.worker` and nothing else of resurge, and
nothing else of resurge imports them (the control plane needs no framework).
"""
