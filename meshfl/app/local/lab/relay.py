"""A TCP relay on 127.0.0.1: the lifecycle shared by the link shaping and chaos proxies.

A subclass implements :meth:`TcpRelay._relay` (what happens to the bytes of one accepted
connection); this base class listens on a free port of 127.0.0.1, connects each accepted
client to the target, runs the relay, closes both sides when it ends, and stops
everything from another thread. stdlib asyncio streams, one event loop in a daemon
thread per relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

__all__ = ["TcpRelay"]


class TcpRelay:
    """Relay TCP connections from 127.0.0.1 to ``target_host:target_port``.

    Parameters
    ----------
    target_host, target_port : str, int
        Where every accepted connection is relayed (the broker).

    Attributes
    ----------
    port : int or None
        The listening port on 127.0.0.1 once started.

    """

    name = "tcp-relay"
    """The thread's name."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host, self.target_port = target_host, target_port
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()

    def start(self) -> int:
        """Listen on a free port of 127.0.0.1 and return it (the loop runs in a thread).

        Raises RuntimeError when already started, OSError when it cannot listen.
        """
        if self._loop is not None:
            raise RuntimeError("this proxy is already started")
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
        self._loop = loop
        self._thread.start()
        try:
            self._server = asyncio.run_coroutine_threadsafe(self._listen(), loop).result(10.0)
        except BaseException:
            self.stop()
            raise
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def stop(self) -> None:
        """Close the listener and every relayed connection, and end the thread."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10.0)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10.0)
        loop.close()

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        """Run ``callback(*args)`` on the relay's loop (thread-safe); nothing once stopped."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(callback, *args)

    async def _listen(self) -> asyncio.Server:
        """Start listening (on the loop: subclasses create their asyncio objects here)."""
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _admit(self) -> bool:
        """Whether to relay a client just accepted (False: close it, like a refusal)."""
        return True

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # always, in a server callback; stop() cancels it
            self._tasks.add(task)
        try:
            if not self._admit():
                return
            try:
                target_r, target_w = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return
            try:
                await self._relay(client_r, client_w, target_r, target_w)
            finally:
                target_w.close()
        except asyncio.CancelledError:
            pass  # stop(): end quietly (asyncio logs a server callback that ends cancelled)
        finally:
            client_w.close()
            if task is not None:
                self._tasks.discard(task)

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        target_r: asyncio.StreamReader,
        target_w: asyncio.StreamWriter,
    ) -> None:
        """Relay one connection both ways until either side closes (subclasses)."""
        raise NotImplementedError
