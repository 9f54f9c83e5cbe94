"""A trio event loop in a background thread, for the blocking faces of the async clients.

::

    portal = TrioPortal("tank-client")
    client = portal.call(make_and_start_client)   # runs in the loop's thread
    portal.close()

Each portal owns its thread and its loop: no global state, so a process may hold several
and a forked child (Spark's Python workers) builds its own instead of reusing a dead one
(see :attr:`TrioPortal.owned_by_this_process`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple

import trio

T = TypeVar("T")
Args = TypeVarTuple("Args")


class PortalClosed(RuntimeError):
    """The portal's loop has stopped; nothing more can run in it."""


class TrioPortal:
    """Runs ``trio.run`` in a daemon thread until :meth:`close`; :meth:`call` crosses over."""

    def __init__(self, name: str = "trio-portal") -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    @property
    def owned_by_this_process(self) -> bool:
        """False in a process forked after the portal started (its thread is not there)."""
        return self._pid == os.getpid()

    @property
    def nursery(self) -> trio.Nursery:
        """The loop's top nursery (use it from inside the loop only)."""
        if self._nursery is None:
            raise PortalClosed("the portal is not running")
        return self._nursery

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # surfaces in __init__ when it fails to start
            self._error = exc
        finally:
            self._nursery = None
            self._ready.set()

    async def _serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.sleep_forever()

    def call(self, fn: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
        """Run ``await fn(*args)`` in the loop and return its result (or raise its error)."""
        if self._token is None or not self._thread.is_alive() or not self.owned_by_this_process:
            raise PortalClosed("the portal is not running")
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking call from the portal's own thread would deadlock")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise PortalClosed("the portal stopped") from None

    def close(self) -> None:
        """Cancel everything running in the loop and join its thread (idempotent)."""
        if not self.owned_by_this_process:
            return
        token = self._token
        if token is not None and self._thread.is_alive():
            def stop() -> None:
                if self._nursery is not None:
                    self._nursery.cancel_scope.cancel()
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop, trio_token=token)
        if threading.current_thread() is not self._thread:
            self._thread.join()
