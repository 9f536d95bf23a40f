"""The dispatcher's HTTP client reads answers as h11 does: a property test.

Answers are made valid (interim answers, HTTP/1.0 or 1.1, keep-alive or close, Content-Length,
chunked or close-delimited bodies, bytes past the answer), then maybe mutated (a byte flipped,
inserted or dropped, line ends changed, Content-Length repeated or contradicted, cut short),
and cut into reads at random places. Each goes through the client (``tests.dispatch.answers``)
and through h11, and both must come to the same verdict on the framing: refused, or accepted
with the same status, body and whether the connection can carry the next request.

Where the two differ by design, the case is named in ``h11_verdict`` and normalised there,
as narrowly as it can be said.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import h11
import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgmb.dispatch import http1
from tests.dispatch.answers import read_answer

KEEP = 1 << 16


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    status: int = 0
    body: bytes = b""
    #: None: not compared (see ``h11_verdict``).
    reusable: bool | None = False


REFUSED = Verdict(False)


def client_verdict(pieces: list[bytes]) -> Verdict:
    response, reusable = read_answer(pieces, keep=KEEP)
    if isinstance(response, Exception):
        assert isinstance(response, (http1.BadResponse, http1.NoResponse)), response
        return REFUSED
    return Verdict(True, response.status, response.body, reusable)


_STATUS_LINE = re.compile(rb"(?m)^HTTP/1\.[01] [0-9]{3} [^\r\n]*")
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _heads(data: bytes) -> bytes:
    """The bytes up to the end of the final head."""
    final = re.search(rb"HTTP/1\.[01] [2-9]", data)
    end = re.compile(rb"\n\r?\n").search(data, final.end()) if final else None
    return data[: end.end()] if end else data


def _head_lines(data: bytes) -> list[bytes]:
    """The final head's lines (the first with a status of 200 or more), lower-cased."""
    heads = re.split(rb"\r?\n\r?\n", data)
    finals = [h for h in heads if re.match(rb"HTTP/1\.[01] [2-9]", h)]
    return finals[0].lower().replace(b"\r", b"").split(b"\n") if finals else []


def _parses(data: bytes, lenient: bool) -> bool:
    parser = httptools.HttpResponseParser(object())
    parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=lenient)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError:
        return False
    return True


def _lone_lf_decides(data: bytes) -> bool:
    """Whether llhttp reads ``data`` with a lone LF taken for a line's end, not without."""
    return _parses(data, lenient=True) and not _parses(data, lenient=False)


def h11_verdict(data: bytes) -> Verdict | None:
    """h11's verdict on ``data``, or None where h11 and llhttp differ by design."""
    # llhttp skips line ends before a status line (as RFC 9112 2.2 asks of a server
    # before a request line); h11 refuses them. Judged without them.
    data = data.lstrip(b"\r\n")
    # llhttp takes any byte but CR and LF in a reason phrase, which a client ignores
    # (RFC 9110 15.1); h11 refuses control characters there. Judged without them.
    data = _STATUS_LINE.sub(lambda m: _CONTROL.sub(b"", m[0]), data)
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=http1.HEAD_LIMIT)
    conn.send(
        h11.Request(method="POST", target="/", headers=[("Host", "t"), ("Content-Length", "2")])
    )
    conn.send(h11.Data(data=b"{}"))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    status, body, ended, eof = 0, b"", False, False
    lines = _head_lines(data)
    lengths = [line for line in lines if line.startswith(b"content-length:")]
    encodings = [line for line in lines if line.startswith(b"transfer-encoding:")]
    if encodings and encodings[-1].split(b":", 1)[1].strip() != b"chunked":
        return None  # h11 takes only "chunked"; llhttp reads others to the connection's end
    if re.search(rb"\n[0-9a-fA-F]{17,}\r?\n", data):
        # A chunk size past 64 bits: llhttp refuses it, as RFC 9112 7.1 asks a recipient
        # to guard against overflow; h11 reads it as a Python integer and waits for more.
        return None
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
                version = event.http_version
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                ended = True
            elif event is h11.NEED_DATA and not ended and not eof:
                conn.receive_data(b"")
                eof = True
            else:  # PAUSED, ConnectionClosed, or NEED_DATA once all is read
                break
    except h11.RemoteProtocolError as exc:
        if ended:  # about bytes past the answer, which only cost the connection
            eof = True
        elif status and eof and "closed connection" in str(exc):
            # A body cut short by the connection's end: the client keeps what came (a
            # success cut short still counts), h11 calls it an error.
            if conn.trailing_data[0]:
                return None  # h11 left an unfinished line (chunk size, trailer) unjudged
            ended = True
        elif _lone_lf_decides(data):
            # The client takes a lone LF for a line's end everywhere, chunked framing
            # too; h11 (and RFC 9112 2.2, which names the start line and fields) only in
            # a head.
            return None
        else:
            return REFUSED
    if not status:
        return REFUSED
    if len(lengths) > 1 or (lengths and encodings):
        # llhttp refuses any repeated Content-Length, and Content-Length beside
        # Transfer-Encoding (RFC 9112 6.3: "ought to be handled as an error"); h11 takes
        # identical repeats, and Transfer-Encoding over Content-Length.
        return None
    if re.search(rb"(?m)^HTTP/1\.0 1", data):
        return None  # llhttp reads nothing past an HTTP/1.0 interim answer; h11 reads on
    if re.search(rb"(?m)^HTTP/(?!1\.[01] )", _heads(data)):
        return None  # h11 takes any HTTP/d.d; the client HTTP/1.0 and HTTP/1.1 only
    if _CONTROL.search(_heads(data)):
        # llhttp refuses control characters in a header (RFC 9110 5.5 lets a recipient);
        # h11 takes any but NUL.
        return None
    reusable = (
        ended
        and not eof
        and conn.our_state is h11.DONE
        and conn.their_state is h11.DONE
        and not conn.trailing_data[0]
    )
    if version == b"1.0" and any(b"keep-alive" in line for line in lines):
        # h11 never reuses an HTTP/1.0 connection; the client does when asked to keep it
        # alive (RFC 9112 9.3), as the PL/Python transport does. Not compared.
        return Verdict(True, status, b"" if 200 <= status < 300 else body[:KEEP], None)
    return Verdict(True, status, b"" if 200 <= status < 300 else body[:KEEP], reusable)


# --- answers ---

TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789", min_size=1, max_size=12)
VALUE = st.text(" !#$%&'()*+,-./0123456789:;<=>?@ABCXYZ[]^_`abcxyz{|}~", max_size=20).map(str.strip)
#: Any bytes, a LF only after a CR: a lone LF past the head is then a mutation's (see above).
BODY = st.lists(
    st.just(b"\r\n") | st.binary(min_size=1, max_size=16).map(lambda b: b.replace(b"\n", b"")),
    max_size=30,
).map(b"".join)


@st.composite
def valid_answers(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 2))):
        interim = draw(st.sampled_from([100, 102, 103]))
        parts.append(b"HTTP/1.1 %d Interim\r\n" % interim)
        if draw(st.booleans()):
            parts.append(b"Link: </a>; rel=preload\r\n")
        parts.append(b"\r\n")
    version = draw(st.sampled_from([b"1.1", b"1.0"]))
    status = draw(st.sampled_from([200, 201, 204, 301, 304, 400, 404, 429, 500, 503]))
    reason = draw(st.sampled_from([b" OK", b" Something Else", b" ", b""]))
    parts.append(b"HTTP/%s %d%s\r\n" % (version, status, reason))
    headers = [(draw(TOKEN), draw(VALUE)) for _ in range(draw(st.integers(0, 3)))]
    for name, value in headers:
        if name.lower() not in ("content-length", "transfer-encoding", "connection"):
            parts.append(f"X-{name}: {value}\r\n".encode())
    connection = draw(st.sampled_from([None, b"close", b"keep-alive", b"Keep-Alive"]))
    if connection is not None:
        parts.append(b"Connection: %s\r\n" % connection)
    body = draw(BODY) if status not in (204, 304) else b""
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if framing == "length":
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    elif framing == "chunked":
        parts.append(b"Transfer-Encoding: chunked\r\n\r\n")
        sizes = draw(st.lists(st.integers(1, 64), max_size=6))
        rest = body
        for size in sizes:
            chunk, rest = rest[:size], rest[size:]
            if chunk:
                parts.append(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if rest:
            parts.append(b"%X\r\n%s\r\n" % (len(rest), rest))
        parts.append(b"0\r\n")
        if draw(st.booleans()):
            parts.append(b"X-Trailer: t\r\n")
        parts.append(b"\r\n")
    else:
        parts.append(b"\r\n" + body)
    if draw(st.integers(0, 9)) == 0:
        parts.append(draw(st.sampled_from([b"EXTRA", b"HTTP/1.1 200 OK\r\n\r\n"])))
    return b"".join(parts)


@st.composite
def mutated(draw: st.DrawFn, answer: bytes) -> bytes:
    kind = draw(
        st.sampled_from(
            ["none", "flip", "insert", "drop", "lf", "cr", "length", "chunk", "truncate"]
        )
    )
    if kind == "none" or not answer:
        return answer
    at = draw(st.integers(0, len(answer) - 1))
    if kind == "flip":
        return answer[:at] + bytes([answer[at] ^ (1 << draw(st.integers(0, 7)))]) + answer[at + 1 :]
    if kind == "insert":
        byte = draw(st.sampled_from([b"\r", b"\n", b" ", b"\t", b"\x00", b":", b"a", b"\x7f"]))
        return answer[:at] + byte + answer[at:]
    if kind == "drop":
        return answer[:at] + answer[at + 1 :]
    if kind == "lf":  # CRLF to LF: all of them, or one
        if draw(st.booleans()):
            return answer.replace(b"\r\n", b"\n")
        return answer.replace(b"\r\n", b"\n", 1)
    if kind == "cr":  # one CRLF to a lone CR
        crlfs = [m.start() for m in re.finditer(rb"\r\n", answer)]
        if not crlfs:
            return answer
        where = draw(st.sampled_from(crlfs))
        return answer[:where] + b"\r" + answer[where + 2 :]
    if kind == "length":  # a second Content-Length, the same or another
        value = draw(st.sampled_from([b"0", b"1", b"5", b"99"]))
        line = b"Content-Length: " + value + b"\r\n"
        final = [m.end() for m in re.finditer(rb"HTTP/1\.[01] [2-9][0-9]{2}[^\n]*\n", answer)]
        if not final:
            return answer
        return answer[: final[0]] + line + answer[final[0] :]
    if kind == "chunk":  # a chunk size said otherwise
        sizes = [m for m in re.finditer(rb"\r\n([0-9a-fA-F]+)\r\n", answer)]
        if not sizes:
            return answer
        size = draw(st.sampled_from(sizes))
        said = draw(
            st.sampled_from([b"0", b"1", b"ff", b"zz", b"-1", b"1 ;x", b"10000000000000000"])
        )
        return answer[: size.start(1)] + said + answer[size.end(1) :]
    return answer[:at]  # truncate


@st.composite
def answers_in_reads(draw: st.DrawFn) -> list[bytes]:
    answer = draw(mutated(draw(valid_answers())))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(answer)), max_size=6))))
    bounds = [0, *cuts, len(answer)]
    return [answer[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(answers_in_reads())
def test_the_client_and_h11_agree_on_framing(pieces):
    expected = h11_verdict(b"".join(pieces))
    if expected is None:
        return
    got = client_verdict(pieces)
    if expected.reusable is None:
        got = Verdict(got.accepted, got.status, got.body, None)  # type: ignore[arg-type]
    assert got == expected


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 No\r\nContent-Length: 2\r\n\r\nno",
        b"HTTP/1.1 500 No\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n",
        b"HTTP/1.1 500 No\r\n\r\nuntil the end",
        b"HTTP/1.1 500 No\r\nContent-Length: 5\r\n\r\nno",
        b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nEXTRA",
    ],
)
def test_the_oracle_says_what_the_client_does(answer):
    """The comparison can fail: on these, both give a verdict, and it is the client's."""
    expected = h11_verdict(answer)
    assert expected is not None and expected.reusable is not None
    assert client_verdict([answer]) == expected
