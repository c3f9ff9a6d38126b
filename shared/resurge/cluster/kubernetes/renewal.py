"""The controller's side of pods' NATS users over time (:mod:`.pod_credentials`).

:meth:`~.controller.Controller.keep_credentials` runs with the controller's loops where
it issues pods' users:

- every ``kube_nats_credentials_seconds / 8`` (at least a second) it renews the JWT in each
  of its pods' Secrets that has less than half its time left, so a container started
  again reads a valid one;
- it answers ``<ns>.v1.access.renew`` (core request-reply, queue group ``controller``):
  the request is JSON ``{"jwt": <the JWT the agent holds>}``, the answer
  ``{"jwt": <the same user's JWT, fresh>}``, or ``{"error": <why not>}`` for a JWT this
  controller did not sign, of a pod it does not run, or of another user than the pod's
  Secret holds. Only the leader's controller runs, so only it answers.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from resurge.cluster.kubernetes.controller import Controller

__all__ = ["renewal_answer", "serve_renewals", "sweep_seconds"]

log = logging.getLogger("resurge.cluster.kubernetes")

QUEUE = "controller"
_SWEEP_MIN_SECONDS = 1.0


async def renewal_answer(controller: Controller, request: bytes) -> dict[str, Any]:
    """The answer to one renewal request (see the module docstring)."""
    issuer = controller.issuer
    if issuer is None:
        return {"error": "this controller issues no NATS users"}
    try:
        body = json.loads(request)
        jwt = body["jwt"]
        if not isinstance(jwt, str):
            raise TypeError("jwt is not a string")
        namespace, pod, user = issuer.pod_of(jwt)
    except (ValueError, KeyError, TypeError) as error:
        return {"error": f"refused: {error}"}
    entry = controller.pods.get((namespace, pod))
    if entry is None or (namespace, pod) in controller.deleting:
        return {"error": f"refused: pod {namespace}/{pod} is not one of this controller's"}
    fresh = await controller.fresh_credentials(namespace, pod, entry[1])
    if fresh is None:
        return {"error": f"pod {namespace}/{pod} has no NATS user Secret"}
    new_jwt, public = fresh
    if public != user:
        return {"error": f"refused: pod {namespace}/{pod} has another NATS user"}
    return {"jwt": new_jwt}


async def serve_renewals(controller: Controller) -> Subscription:
    """Answer renewal requests (module docstring) until the subscription is dropped."""

    async def answer(msg: Msg) -> None:
        try:
            reply = await renewal_answer(controller, msg.data)
        except Exception as error:  # a failed read of a Secret: the agent asks again
            log.warning("cannot renew a pod's NATS user: %s", error)
            reply = {"error": f"not now: {error}"}
        if "error" in reply:
            log.warning("NATS user renewal: %s", reply["error"])
        await msg.respond(json.dumps(reply).encode())

    subject = controller.settings.subjects.access_renew()
    return await controller.bus.nc.subscribe(subject, queue=QUEUE, cb=answer)


def sweep_seconds(seconds: int) -> float:
    """How often the Secrets are swept, for JWTs valid ``seconds``."""
    return max(_SWEEP_MIN_SECONDS, seconds / 8)
