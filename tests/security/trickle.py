"""Servers on loopback that answer one byte at a time: endpoints that would hold a
request for as long as they like if a timeout bounded each step rather than the whole."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: An answer whose head alone takes len(ANSWER) * interval seconds to arrive.
ANSWER = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * 200 + b"\r\nContent-Length: 0\r\n\r\n"


def _accept_each(
    listener: socket.socket, stop: threading.Event, handle: Callable[[socket.socket], None]
) -> None:
    """Hand each connection ``listener`` accepts to ``handle`` in a thread of its own,
    until ``stop`` is set (``listener`` has a timeout, so that it is looked at) or the
    listener is closed."""
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


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

    thread = threading.Thread(target=_accept_each, args=(listener, stop, serve), daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}/hook"
    finally:
        stop.set()
        thread.join()
        listener.close()


def _syn_sent_to(port: int) -> bool:
    """Whether a socket of this network namespace is sending SYNs to loopback's ``port``
    (state SYN_SENT in /proc/net/tcp): a client whose first SYN the full listen queue
    dropped, which retransmits it about a second later."""
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[2] == f"0100007F:{port:04X}" and fields[3] == "02":
                return True
    return False


@contextmanager
def slow_tls(certificate: Path, interval: float = 0.02) -> Iterator[str]:
    """An https URL on 127.0.0.1 that is slow twice over: the first client's connect takes
    about a second (its first SYN finds the listen queue full and is dropped; the queue
    is freed once the client waits, and its retransmitted SYN gets in), then the server's
    side of the TLS handshake arrives one byte every ``interval`` seconds (a couple of KB:
    far longer than any test's timeout). A timeout that bounded the connect and the
    handshake each, rather than both together, would end about a second late."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate)
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # room for one connection waiting to be accepted...
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # ...taken by this one

    def handshake(conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_side=True)
        with conn:
            conn.settimeout(interval)
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    data = None
                except OSError:
                    return
                if data == b"":
                    return  # the client went
                if data:
                    incoming.write(data)
                try:
                    tls.do_handshake()
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return
                for byte in outgoing.read():
                    if stop.wait(interval):
                        return
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        return

    def accept() -> None:
        while not _syn_sent_to(port):
            if stop.wait(0.01):
                return
        listener.accept()[0].close()  # the filler: the retransmitted SYN finds room
        listener.settimeout(0.1)
        _accept_each(listener, stop, handshake)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{port}/hook"
    finally:
        stop.set()
        thread.join()
        filler.close()
        listener.close()
