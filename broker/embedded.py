"""The embedded MQTT broker: amqtt in a background thread, the one-machine default.

amqtt speaks MQTT 3.1.1 only. It answers an MQTT 5 CONNECT with a 3.1.1 CONNACK carrying
return code 1 ("unacceptable protocol version") and closes the socket; the agent's
transport falls back to 3.1.1 on that answer (see ``docs/brokers.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
import warnings
from types import FrameType, TracebackType
from typing import Any

from broker.ports import port_in_use
from meshfl.errors import ConfigError, TransportError

__all__ = ["EmbeddedBroker", "serve"]

_log = logging.getLogger("meshfl.broker")


def _amqtt_config(host: str, port: int) -> dict[str, Any]:
    """Return the amqtt broker configuration: one TCP listener, anonymous access, no $SYS.

    amqtt 0.12 has no maximum message size (a PUBLISH is read with ``readexactly``), so
    128 KiB chunks and 1 MiB payloads need no setting. The default plugins are replaced:
    no packet/event loggers and no ``$SYS`` broadcaster, only anonymous authentication.
    """
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 0}},
        "timeout_disconnect_delay": 0,
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


class EmbeddedBroker:
    """An amqtt MQTT 3.1.1 broker on ``host:port``, run by an asyncio loop in a daemon thread.

    Parameters
    ----------
    host : str, default "127.0.0.1"
        Address to listen on; use "0.0.0.0" to accept other machines.
    port : int, default 1883
        TCP port.
    start_timeout_s : float, default 10.0
        Seconds :meth:`start` waits for the port to accept connections.

    Raises
    ------
    ConfigError
        From :meth:`start`, when the port is already in use.
    TransportError
        From :meth:`start`, when amqtt fails to start for another reason.

    """

    def __init__(self, host: str = "127.0.0.1", port: int = 1883, *, start_timeout_s: float = 10.0):
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker: Any = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """The broker URL, ``mqtt://host:port`` (0.0.0.0 shown as 127.0.0.1)."""
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"mqtt://{shown}:{self.port}"

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the broker thread; return once ``host:port`` accepts TCP connections."""
        if self.running:
            return
        if port_in_use(self.host, self.port):
            raise ConfigError(f"port {self.port} is in use; choose another with --port")
        self._started.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="meshfl-amqtt", daemon=True)
        self._thread.start()
        ready = self._started.wait(self.start_timeout_s)
        if not ready:
            self.stop()
            raise TransportError(
                f"embedded broker on {self.host}:{self.port} did not start "
                f"within {self.start_timeout_s:g} s"
            )
        if self._error is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
            raise TransportError(
                f"embedded broker failed to start on {self.host}:{self.port}: {self._error}"
            ) from self._error
        # No TCP probe here: amqtt leaks the server-side socket of a connection that closes
        # before sending CONNECT (a ResourceWarning). Broker.start() returns once
        # asyncio.start_server() listens, which is the readiness we need.
        _log.info("embedded MQTT broker listening on %s:%d", self.host, self.port)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_broker())
        except BaseException as exc:  # amqtt raises BrokerError(Exception) or OSError
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _start_broker(self) -> None:
        from amqtt.broker import Broker  # lazy: importing broker must not pull in amqtt

        self._broker = Broker(_amqtt_config(self.host, self.port))
        await self._broker.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Shut the broker down (clients see their sockets close) and join its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._broker is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._broker.shutdown(), loop)
            try:
                future.result(timeout=timeout_s)
            except Exception as exc:  # a failed shutdown must not mask the caller's error
                _log.warning("embedded broker shutdown: %s", exc)
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=timeout_s)
        self._thread = None
        self._loop = None
        self._broker = None
        # amqtt drops, unclosed, the server side of a connection that closed before its
        # CONNECT (a link probe's, a port check's): collect those sockets now, quietly,
        # rather than let their ResourceWarning fire later in someone else's code.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        _log.info("embedded MQTT broker on %s:%d stopped", self.host, self.port)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(host: str = "127.0.0.1", port: int = 1883) -> None:
    """Run the embedded broker until SIGINT or SIGTERM, then stop it cleanly.

    Used by ``meshfl broker serve --port``. Must be called from the main thread (signal
    handlers are installed there and restored on return).

    Raises
    ------
    ConfigError
        When the port is in use.

    """
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    # amqtt logs every client that opens with an MQTT 5 CONNECT (our agents probe for
    # MQTT 5 first) as a failed session: warnings only about that, not about the broker.
    logging.getLogger("amqtt").setLevel(logging.ERROR)
    try:
        with EmbeddedBroker(host, port) as broker:
            print(f"embedded MQTT 3.1.1 broker listening on {broker.url}; Ctrl-C stops it",
                  flush=True)  # fmt: skip
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
