"""A server on loopback that answers one byte at a time: an endpoint that would hold a
request for as long as it likes if a timeout bounded each read rather than the whole."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: An answer whose head alone takes len(ANSWER) * interval seconds to arrive.
ANSWER = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * 200 + b"\r\nContent-Length: 0\r\n\r\n"


@contextmanager
def trickling(interval: float = 0.05, host: str = "127.0.0.1") -> Iterator[str]:
    """A URL whose server sends ANSWER one byte every ``interval`` seconds to each request
    (about 10 s with the default), until the client goes or the block ends."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(16)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)  # the request (small: one read holds it)
                for byte in ANSWER:
                    if stop.wait(interval):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return  # the client went

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}/hook"
    finally:
        stop.set()
        thread.join()
        listener.close()
