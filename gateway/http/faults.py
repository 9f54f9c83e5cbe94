"""What the HTTP front ends answer when the embedded store can not write: a fault of the
server, never the client's (not 404 ``unknown_topic``, not a policy refusal).

=============  ======  ==================  ==============================================
store fault    status  ``error``           when
=============  ======  ==================  ==============================================
``no_space``   507     ``disk_full``       the disk is full, or the write would have left
                                           less free than ``store.min_free_bytes``
``read_only``  503     ``disk_read_only``  the data directory's filesystem is read-only
``io_error``   500     ``disk_error``      a write or fsync failed (EIO)
=============  ======  ==================  ==============================================

507 and 503 carry ``Retry-After``: the request may succeed once space is freed or the
filesystem is writable again, without a restart. A WebSocket operation gets
``{"op": "error", "error": "disk_full" | ..., "retry_after_ms"}`` and the socket goes on.
"""

from __future__ import annotations

from typing import Final

from gateway.http.outage import RETRY_AFTER_SECS
from gateway.http.request import HttpError

#: Store fault kind -> (status, error code).
FAULT_STATUS: Final = {"no_space": (507, "disk_full"),
                       "read_only": (503, "disk_read_only"),
                       "io_error": (500, "disk_error")}
#: The error codes of those refusals (also of a produce some of whose partitions they
#: refused: :func:`gateway.http.produce`'s partial answer keeps the gravest one's code).
FAULT_CODES: Final = frozenset(code for _, code in FAULT_STATUS.values())


class StoreFaultError(HttpError):
    """The refusal of a request the store could not write; ``fault`` its kind."""

    def __init__(self, fault: str, message: str) -> None:
        status, code = FAULT_STATUS.get(fault, FAULT_STATUS["io_error"])
        headers = [(b"retry-after", b"%d" % RETRY_AFTER_SECS)] if status != 500 else []
        super().__init__(status, code, message, headers)
        self.fault = fault
