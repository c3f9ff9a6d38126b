"""GPU health detector: GPU errors on a node become faults of the jobs on it (pure).

For a GpuError on node N, every running job with a replica on N gets at most one fault,
decided by the error:

- ``xid``: the XID's action, the job's ``spec.monitoring.gpu.xidOverrides`` first, then
  resurge's XID table (:mod:`resurge.contract.xid`). ``ignore``: nothing. ``restart_process``: a
  process-scope fault, suggested level ``process``. ``reset_gpu`` or ``replace_node``: a
  node-scope fatal fault, suggested level ``node`` (the job leaves the node).
- ``fell_off_bus``, ``reset_failed`` (a GPU reset the restarter asked for did not bring
  the GPU back): a node-scope fatal fault, suggested level ``node``.
- ``ecc`` (the uncorrected ECC count rose): an alert-only fault; the XID the driver
  raises with it (48, 94, 95 ...) decides what happens.

A fault's id is ``gpu:<node>:<gpu>:<xid or error>:<GpuError id>``, and the event id is
derived from the GpuError's id and the job, so a redelivered GpuError yields events
JetStream de-duplicates.
"""

from __future__ import annotations

import hashlib

from resurge.contract.xid import TABLE_VERSION, XidAction, action_for, lookup
from resurge.detection import DetectorContext, JobView
from resurge.events import Envelope, FaultScope, GpuError, RecoveryLevel, Severity

__all__ = ["GpuHealthDetector"]


class GpuHealthDetector:
    """GPU errors a node reports, judged for the jobs on that node."""

    name = "gpu_health"
    kinds = frozenset({"gpu_error"})

    def observe(self, event: GpuError, ctx: DetectorContext) -> list[Envelope]:
        """A fault for each running job on the node, unless the XID table or the job's
        overrides say the error is to be ignored."""
        if event.node is None:
            return []
        out: list[Envelope] = []
        for record in ctx.jobs_on(event.node):
            fault = self._fault(event, event.node, record, ctx)
            if fault is not None:
                out.append(fault)
        return out

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """Nothing to judge over time."""
        return []

    def _fault(
        self, event: GpuError, node: str, record: JobView, ctx: DetectorContext
    ) -> Envelope | None:
        replicas = sorted(p.replica for p in record.placements if p.node == node)
        evidence: dict[str, str | int | float | bool | None] = {
            "node": node,
            "gpu": event.gpu,
            "uuid": event.uuid,
            "error": event.error,
            "xid": event.xid,
            "table_version": TABLE_VERSION,
            "message": event.message,
            "replicas": ",".join(map(str, replicas)),
        }
        alert_only = False
        if event.error == "xid" and event.xid is not None:
            overrides = record.spec.spec.monitoring.gpu.xid_overrides
            action = action_for(event.xid, overrides)
            if action is XidAction.IGNORE:
                return None
            evidence["overridden"] = event.xid in overrides
            reason, what = "gpu_xid", f"XID {event.xid}, {lookup(event.xid).description}"
            outcome = action.value
        elif event.error == "fell_off_bus":
            action = XidAction.REPLACE_NODE
            reason, what, outcome = "gpu_fell_off_bus", "fell off the bus", action.value
        elif event.error == "reset_failed":
            action = XidAction.REPLACE_NODE
            what = f"its reset failed ({event.message})" if event.message else "its reset failed"
            reason, outcome = "gpu_reset_failed", action.value
        else:
            action, alert_only = None, True
            reason, what, outcome = "gpu_ecc", event.message or event.error, "alert only"
        evidence["action"] = None if action is None else action.value
        process = action is XidAction.RESTART_PROCESS
        level = None if alert_only else RecoveryLevel.PROCESS if process else RecoveryLevel.NODE
        label = event.xid if event.error == "xid" else event.error
        digest = hashlib.sha256(record.name.encode()).hexdigest()[:16]
        return ctx.fault(
            event,
            fault_id=f"gpu:{node}:{event.gpu}:{label}:{event.id}",
            reason=reason,
            scope=FaultScope.PROCESS if process else FaultScope.NODE,
            message=f"GPU {event.gpu} on {node}: {what}; {outcome} for job {record.name}",
            severity=Severity.ERROR if process else Severity.FATAL,
            evidence=evidence,
            suggested_level=level,
            alert_only=alert_only,
            id=f"gpu-{event.id}-{digest}",
            job=record.name,
            generation=record.generation,
            replica=replicas[0] if replicas else None,
        )
