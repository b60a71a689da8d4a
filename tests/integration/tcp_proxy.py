"""A TCP proxy that can be cut and restored, to make a database unreachable for a while.

It runs its own asyncio loop on a daemon thread. ``cut()`` closes the listening
socket (new connections are refused) and every connection it carries (both
sides); ``restore()`` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from tests.integration.server_proc import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.connections = 0
        """How many client connections were accepted, in total."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tcp-proxy", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # -- the thread's side ----------------------------------------------------

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, reuse_address=True
        )

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._writers.discard(writer)
            writer.close()
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side ended: end the other, as a severed link would.
            writer.close()

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            transport = writer.transport
            transport.abort()  # RST, no goodbye
        self._writers.clear()

    async def _shutdown(self) -> None:
        await self._cut()
        # Connection handlers still unwinding would be destroyed pending with the loop.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the test's side ------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
