"""Give a ``with`` block's own exception back from a nursery that wrapped it in a group."""

from __future__ import annotations

from typing import NoReturn


def raise_lone(group: BaseExceptionGroup) -> NoReturn:
    """Raise the group's only exception as itself, or the group when it holds several.

    A client's background tasks never raise, so a lone exception in the group of the
    nursery around a ``with`` block is the block's own: callers see it unwrapped.
    """
    if len(group.exceptions) == 1:
        raise group.exceptions[0] from None
    raise group
