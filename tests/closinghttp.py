"""HTTP servers that end connections the way some real servers do, for keep-alive clients.

``ClosingServer`` answers HTTP/1.1 without ever saying it will close (no ``Connection:
close``), then ends each connection after one answer, in one of two ways:

* ``"idle"``: closes it right after the answer, as a server whose idle timeout is short;
* ``"next"``: keeps it open until the client sends its next request, then closes it
  without reading it, so the close crosses the request (the client sees a reset or an
  empty reply, never an answer; the request was not handled and is not recorded).

``Http10Server`` is Python's ``http.server`` speaking HTTP/1.0: one request per connection,
and the body's end is the connection's end (no Content-Length).

``RawServer`` answers with scripted bytes, for what well-behaved servers never send: it
reads each request (its head and a Content-Length body) and sends the next scripted answer
byte for byte. A script item is bytes (the connection stays open for the next request) or a
``Raw`` that can close the connection after sending, or send its bytes one at a time;
past the script, answers are ``200`` with an empty body. With an ``ssl_context`` it speaks TLS.

All record each request they handled with the client's port (one port per connection).
"""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO, Literal, TypeVar

from tests.waiting import DEADLINE


@dataclass(frozen=True)
class Handled:
    """One request a server handled (and answered)."""

    client_port: int
    body: bytes


class _Recorder:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._handled: list[Handled] = []

    def _record(self, item: Handled) -> None:
        with self._lock:
            self._handled.append(item)
            self._lock.notify_all()

    @property
    def handled(self) -> list[Handled]:
        """The requests handled so far, in order."""
        with self._lock:
            return list(self._handled)


class _SocketServer(_Recorder):
    """A listener on 127.0.0.1 on a free port, each connection served by ``_serve`` in a
    thread of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def url(self, path: str = "/", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def __enter__(self: _Server) -> _Server:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        # A close alone would leave accept() waiting in its thread; a shutdown ends it.
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=DEADLINE)

    def _accept(self) -> None:
        while True:
            try:
                conn, address = self._listener.accept()
            except OSError:  # closed by __exit__
                return
            threading.Thread(target=self._serve, args=(conn, address[1]), daemon=True).start()

    def _serve(self, conn: socket.socket, port: int) -> None:
        raise NotImplementedError

    @staticmethod
    def _read_request(reader: BinaryIO) -> tuple[bytes, bytes]:
        """One request's head (its header lines; empty once the client closed) and body."""
        head = b""
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            head += line
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return head, reader.read(length)


_Server = TypeVar("_Server", bound=_SocketServer)


class ClosingServer(_SocketServer):
    """HTTP/1.1 on 127.0.0.1 that ends every connection after one answer (see the module)."""

    def __init__(self, mode: Literal["idle", "next"]) -> None:
        super().__init__()
        self.mode = mode

    def _serve(self, conn: socket.socket, port: int) -> None:
        conn.settimeout(DEADLINE)
        # Both closed on the way out: the socket's file is its last reference.
        with conn, conn.makefile("rb") as reader:
            _, body = self._read_request(reader)
            self._record(Handled(port, body))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            if self.mode == "next":
                # Wait for the next request's first bytes (or the client's close), then
                # close with them unread: the kernel answers the client with a reset.
                conn.recv(1, socket.MSG_PEEK)


class Http10Server(_Recorder):
    """Python's http.server in HTTP/1.0: answers ``body`` with no Content-Length."""

    def __init__(self, body: bytes = b"ok") -> None:
        super().__init__()
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder._record(Handled(self.client_address[1], data))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet tests

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> Http10Server:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=DEADLINE)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class Raw:
    """Bytes to send as an answer; ``close`` ends the connection after them (a FIN);
    ``trickle`` sends them a byte at a time, each in a segment of its own."""

    data: bytes
    close: bool = False
    trickle: bool = False


class RawServer(_SocketServer):
    """Scripted answers on 127.0.0.1 (see the module)."""

    def __init__(
        self, script: Iterable[bytes | Raw] = (), ssl_context: ssl.SSLContext | None = None
    ) -> None:
        super().__init__()
        self._script = deque(item if isinstance(item, Raw) else Raw(item) for item in script)
        self._script_lock = threading.Lock()
        self._tls = ssl_context
        self.heads: list[bytes] = []

    def _next(self) -> Raw:
        with self._script_lock:
            return self._script.popleft() if self._script else Raw(OK)

    def _serve(self, conn: socket.socket, port: int) -> None:
        conn.settimeout(DEADLINE)
        if self._tls is not None:
            try:
                conn = self._tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):  # a client that refused the certificate
                conn.close()
                return
        with conn, conn.makefile("rb") as reader:
            while True:
                head, body = self._read_request(reader)
                if not head:
                    return  # the client closed the connection
                with self._script_lock:
                    self.heads.append(head)
                self._record(Handled(port, body))
                answer = self._next()
                try:
                    if answer.trickle:
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        for byte in range(len(answer.data)):
                            conn.sendall(answer.data[byte : byte + 1])
                    else:
                        conn.sendall(answer.data)
                except OSError:
                    return
                if answer.close:
                    return
