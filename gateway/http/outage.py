"""What the HTTP front ends answer while the backend's upstream is away.

In bridge mode and upstream-Kafka mode the backend may lose its upstream (a Tank broker, a
Kafka cluster). It then raises :class:`~gateway.core.contract.BackendUnavailable` and
says so through :meth:`~gateway.core.contract.Backend.unavailable`. The front ends
answer, and go on serving once the upstream is back, without a restart:

- a request (produce, fetch, topics, the console's overview, the start of an SSE stream):
  503 ``{"error": "unavailable", "message"}`` with ``Retry-After: 1`` (the session answers
  every :class:`~gateway.core.contract.BackendUnavailable` so), at once when the outage
  is known (:func:`~gateway.core.contract.ensure_available`), else after the backend's
  own wait for its upstream (``upstream.wait_secs``);
- a WebSocket operation: ``{"op": "error", "request": "publish" | "attach", ...}``
  (:func:`op_error`), the socket goes on;
- an attached subscription (WebSocket, SSE): told once (``unavailable``), then resumed by
  offset after ``available`` (:mod:`gateway.http.cursor`).
"""

from __future__ import annotations

from typing import Any, Final

from gateway.core.contract import BackendUnavailable, ProduceCode
from gateway.http.messages import dumps
from gateway.http.request import HttpError

#: What ``Retry-After`` says (seconds), and the WebSocket / SSE ``retry_after_ms``.
RETRY_AFTER_SECS: Final = 1
RETRY_AFTER_MS: Final = RETRY_AFTER_SECS * 1000
#: Produce outcomes that say the append did not happen (or is not known to have) for want
#: of a working log: while the upstream is away, answered as ``unavailable`` (HTTP 503, a
#: WebSocket publish's error message), the client may send it again.
FAILED_APPENDS: Final = frozenset({ProduceCode.IO_FAULT, ProduceCode.ACK_TIMEOUT})


def unavailable_error(reason: str) -> HttpError:
    """The 503 refusal of a request the backend could not serve (its upstream is away)."""
    return HttpError(503, "unavailable", reason,
                     [(b"retry-after", b"%d" % RETRY_AFTER_SECS)])


def outage_of(exc: BaseException) -> BackendUnavailable | None:
    """``exc`` when it says the backend's upstream is away, or the first such error of an
    exception group made only of them (a nursery's); else None."""
    if isinstance(exc, BackendUnavailable):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found, rest = exc.split(BackendUnavailable)
        if found is not None and rest is None:
            first: BaseException = found
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            return first if isinstance(first, BackendUnavailable) else None
    return None


def op_error(request: str, obj: dict[str, Any], topic: str, partition: int, reason: str,
             error: str = "unavailable") -> dict[str, Any]:
    """The WebSocket message saying that one operation (``request``: ``publish`` or
    ``attach``, as the client sent it in ``obj``) failed; the socket goes on."""
    return {"op": "error", "request": request, "id": obj.get("id"), "topic": topic,
            "partition": partition, "error": error, "message": reason,
            "retry_after_ms": RETRY_AFTER_MS}


def sse_unavailable(reason: str) -> bytes:
    """The SSE event telling a stream that its partitions can not be read now."""
    return b"event: unavailable\ndata: " + dumps(
        {"error": "unavailable", "message": reason, "retry_after_ms": RETRY_AFTER_MS}
    ) + b"\n\n"


def sse_available(last_event_id: str) -> bytes:
    """The SSE event telling a stream that it resumes (after ``last_event_id``)."""
    return b"event: available\ndata: " + dumps({"last_event_id": last_event_id}) + b"\n\n"
