"""``cdc registry serve``: the log's schemas through Confluent's Schema Registry REST API.

The log keeps its Avro schemas itself (the local ``schemas.jsonl`` or the Kafka backend's
``log.schemas_topic``) and writes Confluent's wire format with their ids. This read-only server
answers the subset of the Schema Registry API that consumers use to decode values — so
confluent-kafka's ``SchemaRegistryClient`` and ``AvroDeserializer``, Spark jobs fetching a
schema by id, or any client of that API read the topics — in a process of its own, so consumers
keep working while capture is down:

* ``GET /subjects`` — every subject (``<topic>-value``, ``<topic>-key``)
* ``GET /subjects/{subject}/versions`` — its versions, ``[1, 2, ...]``
* ``GET /subjects/{subject}/versions/{version|latest}`` — ``{subject, version, id, schema}``
* ``GET /schemas/ids/{id}`` — ``{schema}`` (``schemaType`` is Avro's default: left out)
* ``GET /schemas/ids/{id}/versions`` — ``[{subject, version}]``
* ``GET /config``, ``GET /config/{subject}`` — ``{"compatibilityLevel": "NONE"}``

Errors use the registry's JSON form (``{"error_code": 40403, "message": ...}``). Anything that
would change a schema answers 405: schemas are registered by capture only. Keys are the log's
canonical JSON bytes, not Avro: read them as strings (the ``-key`` subjects describe them).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

from cdc.errors import CdcError, SchemaError
from cdc.log.base import SchemaRegistry
from cdc.log.schemas import canonical

_JSON = "application/vnd.schemaregistry.v1+json"
#: the registry's error codes: subject, version, schema not found
_NO_SUBJECT, _NO_VERSION, _NO_SCHEMA = 40401, 40402, 40403


class _NotFound(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _answer_for(store: SchemaRegistry, path: str) -> Any:
    """The JSON answer to ``GET path`` (raises :class:`_NotFound`)."""
    parts = [unquote(p) for p in urlparse(path).path.strip("/").split("/") if p]
    if parts == ["subjects"]:
        return store.subjects()
    if parts[:1] == ["config"] and len(parts) <= 2:
        return {"compatibilityLevel": "NONE"}
    if len(parts) >= 3 and parts[0] == "subjects" and parts[2] == "versions":
        versions = store.versions(parts[1])
        if not versions:
            raise _NotFound(_NO_SUBJECT, f"Subject '{parts[1]}' not found.")
        if len(parts) == 3:
            return [registered.version for registered in versions]
        if len(parts) == 4:
            wanted = parts[3]
            found = versions[-1] if wanted in ("latest", "-1") else next(
                (r for r in versions if str(r.version) == wanted), None)
            if found is None:
                raise _NotFound(_NO_VERSION, f"Version {wanted} not found.")
            return {"subject": found.subject, "version": found.version, "id": found.id,
                    "schema": canonical(found.schema)}
    if len(parts) in (3, 4) and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
        try:
            found = store.get(int(parts[2]))
        except SchemaError:
            raise _NotFound(_NO_SCHEMA, f"Schema {parts[2]} not found") from None
        if len(parts) == 3:
            return {"schema": canonical(found.schema)}
        if parts[3] == "versions":
            return [{"subject": found.subject, "version": found.version}]
    raise _NotFound(404, f"no such resource: {path}")


def make_server(store: SchemaRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """The registry's HTTP server on ``host:port`` (``port`` 0: a free one), not started."""
    lock = threading.Lock()  # the stores are not made for concurrent readers

    class Handler(BaseHTTPRequestHandler):
        server_version = "cdc-registry"

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", _JSON)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            try:
                with lock:
                    body = _answer_for(store, self.path)
            except _NotFound as missing:
                self._send(404, {"error_code": missing.code, "message": str(missing)})
                return
            except CdcError as exc:  # the log is unreachable just now
                self._send(503, {"error_code": 50003, "message": exc.problem})
                return
            self._send(200, body)

        def _refuse(self) -> None:
            self._send(405, {"error_code": 405, "message": "cdc's registry is read-only: "
                             "schemas are registered by cdc capture"})

        do_POST = do_PUT = do_DELETE = _refuse  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            return

    try:
        return ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise CdcError(f"cannot listen on {host}:{port}: {exc.strerror}",
                       "choose another --port (or stop what listens there)") from None


def serve(store: SchemaRegistry, host: str, port: int,
          ready: Callable[[str], None] = lambda url: None) -> None:
    """Serve until interrupted; ``ready(url)`` once listening."""
    server = make_server(store, host, port)
    ready(f"http://{host}:{server.server_address[1]}")
    try:
        server.serve_forever()
    finally:
        server.server_close()


