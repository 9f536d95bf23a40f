-- pgmb-standin for pgsql-http 1.6 (https://github.com/pramsey/pgsql-http): the same types
-- and function signatures as pgsql-http's http--1.6.sql, implemented in PL/Python so the
-- in-database dispatch path can be tested on Debian 12, which does not package pgsql-http.
-- For tests only; README.md lists what it does and does not reproduce.

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION http" to load this file. \quit

CREATE DOMAIN http_method AS text;
CREATE DOMAIN content_type AS text
CHECK (
    VALUE ~ '^\S+\/\S+'
);

CREATE TYPE http_header AS (
    field VARCHAR,
    value VARCHAR
);

CREATE TYPE http_response AS (
    status INTEGER,
    content_type VARCHAR,
    headers http_header[],
    content VARCHAR
);

CREATE TYPE http_request AS (
    method http_method,
    uri VARCHAR,
    headers http_header[],
    content_type VARCHAR,
    content VARCHAR
);

-- ---------------------------------------------------------------------------------------
-- Private helpers of the stand-in (pgsql-http has no such functions).
--
-- Errors are worded as pgsql-http words them (curl's messages, SQLSTATE XX000). A Python
-- exception would reach the client as "plpy.Error: <message>", so the PL/Python helpers
-- return the message and the PL/pgSQL wrappers raise it unchanged.
-- ---------------------------------------------------------------------------------------

-- Validates a curl option and keeps it for this session in PL/Python's GD, which lives as
-- long as the backend does and ignores transactions, as pgsql-http's static option table.
CREATE FUNCTION http_standin_set_curlopt(curlopt text, value text)
    RETURNS text
    LANGUAGE plpython3u
AS $py$
import re

# pgsql-http 1.6's settable_curlopts, in its order (http_list_curlopt lists in this order).
names = [
    "CURLOPT_CAINFO", "CURLOPT_TIMEOUT", "CURLOPT_TIMEOUT_MS", "CURLOPT_CONNECTTIMEOUT",
    "CURLOPT_CONNECTTIMEOUT_MS", "CURLOPT_USERAGENT", "CURLOPT_USERPWD", "CURLOPT_IPRESOLVE",
    "CURLOPT_SSLCERTTYPE", "CURLOPT_PROXY", "CURLOPT_PROXYPORT", "CURLOPT_PROXYUSERNAME",
    "CURLOPT_PROXYPASSWORD", "CURLOPT_TLSAUTH_USERNAME", "CURLOPT_TLSAUTH_PASSWORD",
    "CURLOPT_TLSAUTH_TYPE", "CURLOPT_DNS_SERVERS", "CURLOPT_TCP_KEEPALIVE",
    "CURLOPT_TCP_KEEPIDLE", "CURLOPT_SSL_VERIFYHOST", "CURLOPT_SSL_VERIFYPEER",
    "CURLOPT_SSLCERT", "CURLOPT_SSLKEY", "CURLOPT_PRE_PROXY", "CURLOPT_PROXY_CAINFO",
    "CURLOPT_PROXY_TLSAUTH_USERNAME", "CURLOPT_PROXY_TLSAUTH_PASSWORD",
    "CURLOPT_PROXY_TLSAUTH_TYPE",
]
longs = {
    "CURLOPT_TIMEOUT", "CURLOPT_TIMEOUT_MS", "CURLOPT_CONNECTTIMEOUT",
    "CURLOPT_CONNECTTIMEOUT_MS", "CURLOPT_IPRESOLVE", "CURLOPT_PROXYPORT",
    "CURLOPT_TCP_KEEPALIVE", "CURLOPT_TCP_KEEPIDLE", "CURLOPT_SSL_VERIFYHOST",
    "CURLOPT_SSL_VERIFYPEER",
}
name = next((n for n in names if n.lower() == curlopt.lower()), None)
if name is None:
    return f"curl option '{curlopt}' is not available for run-time configuration"
if name in longs:
    # pgsql-http reads numbers with strtol: leading digits count, anything else reads as 0.
    found = re.match(r"\s*([+-]?\d+)", value)
    number = int(found.group(1)) if found else 0
    if not -(2**63) <= number < 2**63:
        return f"invalid integer provided for '{name}'"
    if number < 0 and "TIMEOUT" in name:
        return "A libcurl function was given a bad argument"
GD["http_standin.curlopt_names"] = names
GD.setdefault("http_standin.curlopts", {})[name] = value
return None
$py$;

-- Performs one request (following redirects as pgsql-http does) and returns either the
-- response or the error message pgsql-http would raise.
CREATE FUNCTION http_standin_perform(
    request http_request, OUT response http_response, OUT error text
)
    LANGUAGE plpython3u
AS $py$
import base64
import gzip
import http.client
import re
import select
import socket
import ssl
import time
import zlib
from urllib.parse import unquote, urljoin, urlsplit


class Failure(Exception):
    """A transfer error, worded as curl words it."""


def failed(message):
    return {"response": None, "error": message}


if request is None:
    return failed("An http_request must be provided")
if request["uri"] is None:
    return failed("http_request.uri is NULL")
if request["method"] is None:
    return failed("http_request.method is NULL")

# --- options: pgsql-http's defaults, then the session's curl options, then the GUCs ---
if "plan" not in SD:
    SD["plan"] = plpy.prepare(
        "SELECT version() AS version,"
        " current_setting('http.timeout_msec', true) AS timeout_msec,"
        " current_setting('http.keepalive', true) AS keepalive"
    )
    SD["ping"] = plpy.prepare("SELECT 1")
settings = plpy.execute(SD["plan"])[0]
opts = GD.get("http_standin.curlopts", {})


def long_opt(name):
    found = re.match(r"\s*([+-]?\d+)", opts[name])
    return int(found.group(1)) if found else 0


# pgsql-http sets a 1 s connect and a 5 s total timeout on every request unless told otherwise.
connect_ms, total_ms = 1000, 5000
# Both spellings set the same curl timeout; pgsql-http applies them in this order.
if "CURLOPT_TIMEOUT" in opts:
    total_ms = long_opt("CURLOPT_TIMEOUT") * 1000
if "CURLOPT_TIMEOUT_MS" in opts:
    total_ms = long_opt("CURLOPT_TIMEOUT_MS")
if "CURLOPT_CONNECTTIMEOUT" in opts:
    connect_ms = long_opt("CURLOPT_CONNECTTIMEOUT") * 1000
if "CURLOPT_CONNECTTIMEOUT_MS" in opts:
    connect_ms = long_opt("CURLOPT_CONNECTTIMEOUT_MS")
guc = re.fullmatch(r"\s*(\d+)\s*(ms|s|min|h|d)?\s*", settings["timeout_msec"] or "")
if guc:
    units = {None: 1, "ms": 1, "s": 1000, "min": 60000, "h": 3600000, "d": 86400000}
    guc_ms = int(guc.group(1)) * units[guc.group(2)]
    if guc_ms > 0:  # http.timeout_msec, when set, wins over CURLOPT_TIMEOUT(_MS)
        total_ms = guc_ms
keepalive = (settings["keepalive"] or "").strip().lower() in ("on", "true", "yes", "1", "t", "y")
user_agent = opts.get("CURLOPT_USERAGENT", settings["version"])

started = time.monotonic()
deadline = started + total_ms / 1000.0 if total_ms > 0 else None


def elapsed_ms():
    return int((time.monotonic() - started) * 1000)


def remaining():
    return None if deadline is None else deadline - time.monotonic()


def operation_timeout(received):
    return Failure(
        f"Operation timed out after {elapsed_ms()} milliseconds with {received} bytes received"
    )


def check_interrupts():
    # A query cancel or statement_timeout is only noticed by PostgreSQL code, so run a
    # trivial statement while waiting; pgsql-http watches for SIGINT for the same reason.
    try:
        plpy.execute(SD["ping"])
    except plpy.spiexceptions.QueryCanceled:
        raise Failure("HTTP request cancelled") from None


def tls_context():
    context = ssl.create_default_context(cafile=opts.get("CURLOPT_CAINFO"))
    if "CURLOPT_SSL_VERIFYHOST" in opts and long_opt("CURLOPT_SSL_VERIFYHOST") == 0:
        context.check_hostname = False
    if "CURLOPT_SSL_VERIFYPEER" in opts and long_opt("CURLOPT_SSL_VERIFYPEER") == 0:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if "CURLOPT_SSLCERT" in opts:
        context.load_cert_chain(opts["CURLOPT_SSLCERT"], opts.get("CURLOPT_SSLKEY"))
    return context


def connect(scheme, host, port):
    limit = connect_ms / 1000.0 if connect_ms > 0 else 300.0  # 0 is curl's 300 s default
    left = remaining()
    if left is not None:
        limit = min(limit, left)
    if limit <= 0:
        raise operation_timeout(0)
    began = time.monotonic()

    def took():
        return int((time.monotonic() - began) * 1000)

    if scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=limit, context=tls_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=limit)
    try:
        conn.connect()
    except TimeoutError:
        raise Failure(f"Connection timed out after {took()} milliseconds") from None
    except socket.gaierror:
        raise Failure(f"Could not resolve host: {host}") from None
    except ssl.SSLCertVerificationError as exc:
        raise Failure(f"SSL certificate problem: {exc.verify_message}") from None
    except ssl.SSLError as exc:
        raise Failure(f"OpenSSL SSL_connect: {exc.reason or exc}") from None
    except OSError:
        raise Failure(
            f"Failed to connect to {host} port {port} after {took()} ms:"
            " Couldn't connect to server"
        ) from None
    return conn


pool = GD.setdefault("http_standin.connections", {})


def exchange(conn, verb, target, headers, body):
    """Send one request on conn and read the response head; errors are left to the caller."""
    sock = conn.sock
    left = remaining()
    if left is not None and left <= 0:
        raise operation_timeout(0)
    sock.settimeout(left)
    conn.putrequest(verb, target, skip_host=True, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value.encode("utf-8"))
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    # Wait for the first byte in slices so that a cancel is noticed.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        left = remaining()
        if left is not None and left <= 0:
            raise operation_timeout(0)
        if poller.poll(250 if left is None else max(1, min(250, int(left * 1000)))):
            break
        check_interrupts()
    sock.settimeout(remaining())
    return sock, conn.getresponse()


def hop(verb, url, headers, body, internal):
    """One request/response; returns (status, header pairs, body bytes)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise Failure(f'Protocol "{parts.scheme}" not supported or disabled in libcurl')
    host = parts.hostname
    if not host:
        raise Failure("URL using bad/illegal format or missing URL")
    default_port = 443 if scheme == "https" else 80
    try:
        port = parts.port or default_port
    except ValueError:
        raise Failure("Port number was not a decimal number between 0 and 65535") from None
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    host_header = f"[{host}]" if ":" in host else host
    if port != default_port:
        host_header += f":{port}"

    defaults = [("Host", host_header)]
    credentials = internal.get("userpwd")
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    if credentials:
        basic = base64.b64encode(credentials.encode()).decode()
        defaults.append(("Authorization", f"Basic {basic}"))
    defaults += [
        ("User-Agent", user_agent),
        ("Accept", "*/*"),
        ("Accept-Encoding", "deflate, gzip"),
    ]
    # As curl does: a header given by the caller replaces curl's own of that name, and a
    # header whose value is empty is not sent at all.
    given = {name.lower() for name, _ in headers}
    sent = [(n, v) for n, v in defaults if n.lower() not in given]
    sent += [(n, v) for n, v in headers if v.strip()]

    key = (scheme, host, port)
    conn = pool.pop(key, None) if keepalive else None
    reused = conn is not None
    while True:
        if conn is None:
            conn = connect(scheme, host, port)
        try:
            sock, resp = exchange(conn, verb, target, sent, body)
            break
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            conn.close()
            conn = None
            if reused:  # a kept-alive connection the server has closed: curl reconnects once
                reused = False
                continue
            if isinstance(exc, http.client.RemoteDisconnected):
                raise Failure("Empty reply from server") from None
            if isinstance(exc, BrokenPipeError):
                raise Failure("Send failure: Broken pipe") from None
            raise Failure("Recv failure: Connection reset by peer") from None
        except TimeoutError:
            conn.close()
            raise operation_timeout(0) from None
        except OSError as exc:
            conn.close()
            raise Failure(f"Recv failure: {exc.strerror or exc}") from None
        except http.client.BadStatusLine:
            conn.close()
            raise Failure("Received HTTP/0.9 when not allowed") from None
        except (http.client.HTTPException, ValueError) as exc:
            conn.close()
            if isinstance(exc, (http.client.InvalidURL, UnicodeEncodeError)):
                raise Failure("URL using bad/illegal format or missing URL") from None
            raise Failure(str(exc)) from None
        except Failure:
            conn.close()
            raise

    chunks, received = [], 0
    try:
        while True:
            left = remaining()
            if left is not None and left <= 0:
                raise operation_timeout(received)
            sock.settimeout(left)
            chunk = resp.read1(65536)
            if not chunk:
                break
            chunks.append(chunk)
            received += len(chunk)
    except TimeoutError:
        conn.close()
        raise operation_timeout(received) from None
    except http.client.IncompleteRead as exc:
        conn.close()
        raise Failure(f"transfer closed with {exc.expected} bytes remaining to read") from None
    except ConnectionResetError:
        conn.close()
        raise Failure("Recv failure: Connection reset by peer") from None
    except Failure:
        conn.close()
        raise
    # read1() leaves a Content-Length response open at its end, and http.client refuses a
    # new request on a connection until the previous response is closed.
    resp.close()
    if keepalive and not resp.will_close:
        pool[key] = conn
    else:
        conn.close()

    data = b"".join(chunks)
    encoding = (resp.getheader("Content-Encoding") or "").strip().lower()
    try:
        if encoding in ("gzip", "x-gzip"):
            data = gzip.decompress(data)
        elif encoding == "deflate":
            try:
                data = zlib.decompress(data)
            except zlib.error:
                data = zlib.decompress(data, -zlib.MAX_WBITS)
    except (OSError, EOFError, zlib.error) as exc:
        raise Failure(f"Error while processing content unencoding: {exc}") from None
    return resp.status, list(resp.msg.items()), data


method_str = request["method"]
method = method_str.upper()
if method not in ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"):
    method = None  # passed to curl unchanged, as CURLOPT_CUSTOMREQUEST
content = request["content"]

# Headers in pgsql-http's order: its own two, the caller's, then the content type.
headers = [("Connection", "Keep-Alive" if keepalive else "close"), ("Charsets", "utf-8")]
for item in request["headers"] or []:
    if item is None or item["field"] is None:
        continue
    field = item["field"]
    if field == "" or field[:12].lower() == "content-type":
        plpy.notice("'Content-Type' is not supported as an optional header")
        continue
    headers.append((field, item["value"] if item["value"] is not None else ""))

# How curl is driven, as pgsql-http drives it: "mode" is curl's own request kind (POST with
# fields, PUT upload, GET, HEAD) and "custom" the CURLOPT_CUSTOMREQUEST verb, which curl keeps
# across redirects.
custom = None
body = None
if content is not None:
    if request["content_type"] is None:
        return failed("http_request.content_type is NULL")
    headers.append(("Content-Type", request["content_type"]))
    body = content.encode("utf-8")
    if method in ("GET", "POST", "DELETE"):
        mode = "POST"
        custom = None if method == "POST" else method
    else:
        mode = "PUT"
        custom = None if method == "PUT" else (method or method_str)
elif method == "DELETE":
    mode, custom = "GET", "DELETE"
elif method == "HEAD":
    mode = "HEAD"
elif method in ("PUT", "POST"):
    return failed("http_request.content is NULL")
elif method is None:
    mode, custom = "GET", method_str
else:
    # GET, and also PATCH without content: pgsql-http sets no verb for it, so curl sends GET.
    mode = "GET"

uri = request["uri"]
url = uri if "://" in uri else "http://" + uri  # curl guesses http:// for a bare host
origin = urlsplit(url)[:2]
internal = {"userpwd": opts.get("CURLOPT_USERPWD")}
follow = method != "HEAD"  # pgsql-http follows up to 5 redirects, except for HEAD
redirects = 0
received_headers = []  # every response's headers, redirects included, as curl hands them over
try:
    while True:
        status, pairs, data = hop(custom or mode, url, headers, body, internal)
        received_headers += pairs
        location = next((v for n, v in pairs if n.lower() == "location"), None)
        if not (follow and 300 <= status < 400 and status != 304 and location):
            break
        if redirects == 5:
            raise Failure("Maximum (5) redirects followed")
        redirects += 1
        url = urljoin(url, location.strip())
        if (status in (301, 302) and mode == "POST") or (status == 303 and mode != "GET"):
            mode, body = "GET", None
        if urlsplit(url)[:2] != origin:
            # curl does not hand credentials to another host.
            internal = {}
            headers = [(n, v) for n, v in headers if n.lower() not in ("authorization", "cookie")]
except Failure as exc:
    return failed(str(exc))

# pgsql-http parses curl's header text with this POSIX regex, one header line at a time.
header_line = re.compile(r"^([^ \t\r\n\v\f]+): ?([^ \t\r\n\v\f]+.*)$")
parsed = []
for name, value in received_headers:
    found = header_line.match(f"{name}: {value}")
    if found:
        parsed.append({"field": found.group(1), "value": found.group(2)})

content_type = next((v.strip() for n, v in reversed(pairs) if n.lower() == "content-type"), None)
text = None
if data:
    charset = None
    for param in (content_type or "").split(";"):
        param = param.strip().lower()
        if param.startswith("charset="):
            charset = param[len("charset="):].strip('"')
            break
    try:
        text = data.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset PostgreSQL knows by a name Python does not
        text = data.decode("utf-8", errors="replace")
    text = text.replace("\x00", "")  # PostgreSQL text cannot hold NUL

return {
    "response": {
        "status": status,
        "content_type": content_type,
        "headers": parsed,
        "content": text,
    },
    "error": None,
}
$py$;

-- ---------------------------------------------------------------------------------------
-- pgsql-http 1.6's functions, same names, arguments and results.
-- ---------------------------------------------------------------------------------------

CREATE FUNCTION http_set_curlopt (curlopt VARCHAR, value VARCHAR)
    RETURNS boolean
    LANGUAGE plpgsql
AS $$
DECLARE
    problem text;
BEGIN
    IF curlopt IS NULL OR value IS NULL THEN
        RETURN false;
    END IF;
    problem := @extschema@.http_standin_set_curlopt(curlopt, value);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = problem, ERRCODE = 'internal_error';
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION http_reset_curlopt ()
    RETURNS boolean
    LANGUAGE plpython3u
AS $py$
GD.pop("http_standin.curlopts", None)
return True
$py$;

CREATE FUNCTION http_list_curlopt ()
    RETURNS TABLE(curlopt text, value text)
    LANGUAGE plpython3u
AS $py$
opts = GD.get("http_standin.curlopts", {})
return [(name, opts[name]) for name in GD.get("http_standin.curlopt_names", []) if name in opts]
$py$;

CREATE FUNCTION http_header (field VARCHAR, value VARCHAR)
    RETURNS http_header
    AS $$ SELECT $1, $2 $$
    LANGUAGE 'sql';

CREATE FUNCTION http(request @extschema@.http_request)
    RETURNS http_response
    LANGUAGE plpgsql
AS $$
DECLARE
    outcome record;
BEGIN
    SELECT * INTO outcome FROM @extschema@.http_standin_perform(request);
    IF outcome.error IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = outcome.error, ERRCODE = 'internal_error';
    END IF;
    RETURN outcome.response;
END
$$;

CREATE FUNCTION http_get(uri VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('GET', $1, NULL, NULL, NULL)::@extschema@.http_request) $$
    LANGUAGE 'sql';

CREATE FUNCTION http_post(uri VARCHAR, content VARCHAR, content_type VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('POST', $1, NULL, $3, $2)::@extschema@.http_request) $$
    LANGUAGE 'sql';

CREATE FUNCTION http_put(uri VARCHAR, content VARCHAR, content_type VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('PUT', $1, NULL, $3, $2)::@extschema@.http_request) $$
    LANGUAGE 'sql';

CREATE FUNCTION http_patch(uri VARCHAR, content VARCHAR, content_type VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('PATCH', $1, NULL, $3, $2)::@extschema@.http_request) $$
    LANGUAGE 'sql';

CREATE FUNCTION http_delete(uri VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('DELETE', $1, NULL, NULL, NULL)::@extschema@.http_request) $$
    LANGUAGE 'sql';

CREATE FUNCTION http_delete(uri VARCHAR, content VARCHAR, content_type VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('DELETE', $1, NULL, $3, $2)::@extschema@.http_request) $$
    LANGUAGE 'sql';

CREATE FUNCTION http_head(uri VARCHAR)
    RETURNS http_response
    AS $$ SELECT @extschema@.http(('HEAD', $1, NULL, NULL, NULL)::@extschema@.http_request) $$
    LANGUAGE 'sql';

-- pgsql-http copies text and bytea byte for byte; within one database that is a conversion
-- from the server encoding to itself.
CREATE FUNCTION text_to_bytea(data TEXT)
    RETURNS BYTEA
    AS $$ SELECT convert_to($1, current_setting('server_encoding')) $$
    LANGUAGE 'sql'
    IMMUTABLE STRICT;

CREATE FUNCTION bytea_to_text(data BYTEA)
    RETURNS TEXT
    AS $$ SELECT convert_from($1, current_setting('server_encoding')) $$
    LANGUAGE 'sql'
    IMMUTABLE STRICT;

-- pgsql-http's urlencode_cstr: unreserved characters pass, a space becomes '+', every other
-- byte becomes %XX (upper case), and a NUL ends the string.
CREATE FUNCTION urlencode(string BYTEA)
    RETURNS TEXT
    LANGUAGE plpython3u
    IMMUTABLE STRICT
AS $py$
safe = b"-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
raw = bytes(string).split(b"\x00", 1)[0]
return "".join("+" if b == 32 else chr(b) if b in safe else f"%{b:02X}" for b in raw)
$py$;

CREATE FUNCTION urlencode(string VARCHAR)
    RETURNS TEXT
    AS $$ SELECT @extschema@.urlencode(@extschema@.text_to_bytea($1)) $$
    LANGUAGE 'sql'
    IMMUTABLE STRICT;

-- pgsql-http's urlencode_jsonb: the top-level keys in jsonb's own order (shorter keys first),
-- scalars only (nested objects and arrays are skipped, null becomes an empty value, numbers
-- lose trailing zeros), joined with '&'; NULL when nothing is left.
CREATE FUNCTION urlencode(data JSONB)
    RETURNS TEXT
    LANGUAGE plpgsql
    IMMUTABLE STRICT
AS $$
DECLARE
    item record;
    parts text[] := '{}';
    scalar text;
BEGIN
    IF jsonb_typeof(data) <> 'object' THEN
        RAISE EXCEPTION 'cannot call urlencode_jsonb on a non-object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR item IN SELECT key, value FROM jsonb_each(data) LOOP
        CONTINUE WHEN item.key = '';
        scalar := CASE jsonb_typeof(item.value)
            WHEN 'string' THEN item.value #>> '{}'
            WHEN 'number' THEN trim_scale((item.value #>> '{}')::numeric)::text
            WHEN 'boolean' THEN item.value #>> '{}'
            WHEN 'null' THEN ''
        END;
        CONTINUE WHEN scalar IS NULL;
        parts := parts || (@extschema@.urlencode(item.key::varchar) || '='
                           || @extschema@.urlencode(scalar::varchar));
    END LOOP;
    RETURN nullif(array_to_string(parts, '&'), '');
END
$$;

CREATE FUNCTION http_get(uri VARCHAR, data JSONB)
    RETURNS http_response
    AS $$
        SELECT @extschema@.http(('GET', $1 || '?' || @extschema@.urlencode($2), NULL, NULL, NULL)::@extschema@.http_request)
    $$
    LANGUAGE 'sql';

-- Form-encodes its argument (Content-Type application/x-www-form-urlencoded), exactly as
-- pgsql-http does: this does NOT send JSON.
CREATE FUNCTION http_post(uri VARCHAR, data JSONB)
    RETURNS http_response
    AS $$
        SELECT @extschema@.http(('POST', $1, NULL, 'application/x-www-form-urlencoded', @extschema@.urlencode($2))::@extschema@.http_request)
    $$
    LANGUAGE 'sql';
