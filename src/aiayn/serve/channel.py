"""The pipe between the server and its model worker process: whole pickled messages.

Either end may block on a full pipe while the other does not read. The worker's end may:
the server always reads. The server's end must not: its messages come from the event
loop, which would stop answering everyone (``/health`` included) while a worker that has
stopped reading (stopped with SIGSTOP, frozen, swapping) held it. So the server
:meth:`~Channel.post`\\ s its messages, and a thread of the channel's own writes them, in
order, as the pipe takes them.
"""

from __future__ import annotations

import pickle
import threading
from collections import deque
from multiprocessing.connection import Connection
from typing import Any


class Channel:
    """One end of the pipe. Plain pickle, not multiprocessing's: tensors in attention maps
    are copied, not moved to shared memory. :meth:`send` is serialized by a lock (several
    threads send); :meth:`post` queues a message for the writer thread, started on the
    first post, and returns at once."""

    def __init__(self, conn: Connection):
        self.conn, self._lock = conn, threading.Lock()
        self._outbox: deque[bytes | None] = deque()  # None: the writer stops there
        self._ready = threading.Condition()
        self._writer: threading.Thread | None = None

    def send(self, *message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)

    def recv(self) -> tuple[Any, ...]:
        return pickle.loads(self.conn.recv_bytes())

    def post(self, *message: Any) -> None:
        """Queue ``message``; the writer thread sends it after those posted before. Once
        one cannot be written (the other end is gone), the writer stops: the reader of
        this end finds the pipe closed and says so."""
        self._put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    @property
    def unsent(self) -> int:
        """Messages posted and not written yet."""
        return len(self._outbox)

    def close(self) -> None:
        """Let the writer thread end once what was posted before is written."""
        self._put(None)
        if self._writer is not None:
            self._writer.join(1.0)

    def _put(self, data: bytes | None) -> None:
        with self._ready:
            self._outbox.append(data)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write, name="aiayn-worker-pipe-writer", daemon=True
                )
                self._writer.start()
            self._ready.notify()

    def _write(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._outbox)
                data = self._outbox[0]
            if data is None:
                return
            try:
                with self._lock:
                    self.conn.send_bytes(data)
            except (OSError, ValueError):  # closed: the reader finds out too
                return
            finally:
                with self._ready:
                    self._outbox.popleft()
