"""A data mirror on the loopback address for the downloader's tests: it serves files from
a dict (path -> bytes) with HTTP Range support, and can be told to misbehave per path:
answer 404, drop the connection half-way through a file, send no length, stall past the
client's timeout, ignore Range requests or answer them with another range, declare a
length that is no number, redirect to itself, or hold a file half-sent until told to go
on. Every request is
logged, so a test can tell what was downloaded (and what was not)."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Mirror:
    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.drop: set[str] = set()  # send half of the body, then close
        self.stall: set[str] = set()  # send nothing until released
        self.no_range: set[str] = set()  # ignore Range: send 200 and the whole file
        self.wrong_range: set[str] = set()  # answer a Range with 206 and the whole file
        self.no_length: set[str] = set()  # no Content-Length: the body ends at the close
        self.length: dict[str, str] = {}  # this Content-Length instead of the body's
        self.loop: set[str] = set()  # 302 to the same path
        self.hold: set[str] = set()  # send half of the body, then wait for `resumed`
        self.abandon = False  # a held file is cut there when resumed, not sent whole
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.released = threading.Event()
        self.resumed = threading.Event()
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.lstrip("/")
                mirror.requests.append((path, self.headers.get("Range")))
                if path in mirror.stall:
                    mirror.released.wait(30)
                    return
                if path in mirror.loop:
                    self.send_response(302)
                    self.send_header("Location", "/" + path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if path not in mirror.files:
                    self.send_error(404, "Not Found")
                    return
                body, start = mirror.files[path], 0
                wanted = self.headers.get("Range")
                if wanted and path not in mirror.no_range:
                    start = int(wanted.removeprefix("bytes=").split("-")[0])
                    if path in mirror.wrong_range:
                        start = 0
                    if start >= len(body):  # with the file's size, as RFC 9110 asks
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                if path in mirror.length:
                    self.send_header("Content-Length", mirror.length[path])
                elif path not in mirror.no_length:
                    self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                rest = body[start:]
                if path in mirror.hold:
                    self.wfile.write(rest[: len(rest) // 2])
                    self.wfile.flush()
                    mirror.resumed.wait(30)
                    if mirror.abandon:
                        self.close_connection = True
                        return
                    rest = rest[len(rest) // 2 :]
                if path in mirror.drop:
                    self.wfile.write(rest[: len(rest) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(rest)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def downloads(self, path: str) -> int:
        return sum(p == path for p, _ in self.requests)

    @contextlib.contextmanager
    def running(self):
        thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.released.set()
            self.resumed.set()
            self.server.shutdown()
            self.server.server_close()
