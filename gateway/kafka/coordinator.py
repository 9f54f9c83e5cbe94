"""FindCoordinator: figtank is the one node, so it coordinates every consumer group.

Transactions are not served: a transactional id's lookup (key type 1) is answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED with a message saying so, which clients treat as
fatal and show (librdkafka: "Failed to find transaction coordinator: ... Transactional
Id authorization failed: figtank does not coordinate transactions"), not retried.
"""

from __future__ import annotations

from typing import Any

from gateway.kafka.context import RequestContext
from gateway.kafka.metadata import NODE_ID
from protocols.kafka.records import Coordinator, FindCoordinatorResponse
from protocols.kafka.types import ErrorCode

#: What a transactional id's lookup is told.
NO_TRANSACTIONS = "figtank does not coordinate transactions"
#: FindCoordinator's key type of a transactional id.
TRANSACTION_KEY = 1


async def find_coordinator(ctx: RequestContext, body: Any,
                           version: int) -> FindCoordinatorResponse:
    """The answer to a FindCoordinator request: this node, for one key (versions 0-3) or
    for each key asked (version 4 and later)."""
    host, port = ctx.advertised
    if body.key_type == TRANSACTION_KEY:
        code, message = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_TRANSACTIONS
        host, port, node = "", -1, -1
    else:
        code, message, node = ErrorCode.NONE, None, NODE_ID
    if version < 4:
        return FindCoordinatorResponse(error_code=code, error_message=message, node_id=node,
                                       host=host, port=port)
    return FindCoordinatorResponse(coordinators=[
        Coordinator(key=key, node_id=node, host=host, port=port, error_code=code,
                    error_message=message)
        for key in body.coordinator_keys])
