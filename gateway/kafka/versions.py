"""ApiVersions: the API keys and versions this listener serves (a subset of what
:mod:`protocols.kafka` declares)."""

from __future__ import annotations

from typing import Final

from gateway.kafka.handlers import HANDLERS
from protocols.kafka.messages import SUPPORTED_VERSIONS
from protocols.kafka.records import ApiVersion, ApiVersionsResponse
from protocols.kafka.types import ApiKey, ErrorCode

#: The API keys the session answers; any other declared one closes the connection.
SERVED: Final = frozenset({ApiKey.PRODUCE, ApiKey.API_VERSIONS, *HANDLERS})

#: What an ApiVersions request is answered (the same for every version).
_API_KEYS: Final = [ApiVersion(key, low, high if high is not None else low)
                    for key, (low, high) in sorted(SUPPORTED_VERSIONS.items())
                    if key in SERVED]


def api_versions(error: int = ErrorCode.NONE) -> ApiVersionsResponse:
    """The ApiVersions answer; ``error`` UNSUPPORTED_VERSION for a too-new request (sent
    as version 0, as Kafka does)."""
    return ApiVersionsResponse(error_code=error, api_keys=list(_API_KEYS))


def served_table() -> str:
    """The Kafka docs page's table of the APIs served and their versions (from the same data as
    the ApiVersions answer)."""
    rows = ["| API | key | versions |", "|---|---|---|"]
    for api in _API_KEYS:
        name = "".join(part.capitalize() for part in ApiKey(api.api_key).name.split("_"))
        rows.append(f"| {name} | {api.api_key} | {api.min_version}-{api.max_version} |")
    return "\n".join(rows)
