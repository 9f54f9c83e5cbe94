"""The sizes of the socket edge, defined once for the listeners and the clients.

Frame size limits are protocol knowledge and live in :mod:`protocols.connection`
(``DEFAULT_MAX_FRAME``, ``BROKER_MAX_FRAME``).
"""

from __future__ import annotations

from typing import Final

#: Bytes asked of the socket per read: read big, then parse every frame in the buffer.
RECEIVE_SIZE: Final = 256 * 1024
#: Largest run of queued frames joined into one write (a larger frame goes alone).
MAX_WRITE: Final = 1024 * 1024
#: Largest count handed to one ``os.sendfile`` call.
SENDFILE_STEP: Final = 1 << 30
