"""Schemas kept in a Schema Registry of the user's (``log.schema_registry.url``): Confluent's
REST API, which Confluent Schema Registry, Apicurio Registry's ``ccompat`` API, Karapace and
Redpanda all speak.

The registry then assigns the ids the log's values carry (Confluent's wire format), so every
consumer of that registry decodes the topics as it decodes any other. Subjects follow
``TopicNameStrategy`` (``<topic>-value``, ``<topic>-key``), as cdc's own store does.

* ``register`` posts the schema to ``/subjects/{subject}/versions`` (the registry answers the
  same id for a schema it holds) and reads its version back (``POST /subjects/{subject}``). A
  schema the registry refuses as incompatible stops capture with the registry's own reason and
  the fix: cdc's schemas follow the tables (a column added or dropped), so the subjects need a
  compatibility that allows it (``NONE``, or ``BACKWARD`` for added nullable columns only).
* ``get`` reads ``/schemas/ids/{id}`` (and ``/schemas/ids/{id}/versions`` for its subject),
  cached: an id's schema never changes.
* An unreachable registry is :class:`~cdc.errors.LogUnavailable` (capture waits it out, as it
  waits out the brokers); any other answer it cannot use is a :class:`~cdc.errors.SchemaError`
  naming the registry's words. The password (``basic_auth_env``) is never logged.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from cdc.errors import LogUnavailable, SchemaError
from cdc.log.base import SchemaRegistry
from cdc.log.schemas import RegisteredSchema, canonical

_JSON = "application/vnd.schemaregistry.v1+json"
TIMEOUT = 15.0
#: Confluent's error code for an incompatible schema
INCOMPATIBLE = 409


class RestSchemaRegistry(SchemaRegistry):
    """A Schema Registry at ``url`` (``basic_auth_env``: the name of a variable holding
    ``user:password``)."""

    def __init__(self, url: str, basic_auth_env: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._auth: str | None = None
        if basic_auth_env:
            secret = os.environ.get(basic_auth_env)
            if not secret:
                raise SchemaError(f"the environment variable {basic_auth_env} "
                                  "(log.schema_registry.basic_auth_env) is not set",
                                  "export it as user:password")
            self._auth = "Basic " + base64.b64encode(secret.encode()).decode()
        self._lock = threading.Lock()
        self._by_id: dict[int, RegisteredSchema] = {}
        self._registered: dict[tuple[str, str], RegisteredSchema] = {}

    # -- HTTP --------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": _JSON, "Accept": _JSON})
        if self._auth:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:  # noqa: S310
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            raise _Refused(error.code, _message(error)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LogUnavailable(f"the schema registry at {self.url} is unreachable ({reason})",
                                 "check log.schema_registry.url and that the registry "
                                 "runs") from None

    # -- the contract ------------------------------------------------------------------------
    def register(self, subject: str, schema: Any) -> RegisteredSchema:
        text = canonical(schema)
        with self._lock:
            found = self._registered.get((subject, text))
            if found is not None:
                return found
            path = f"/subjects/{quote(subject, safe='')}"
            try:
                answer = self._call("POST", f"{path}/versions", {"schema": text})
                looked = self._call("POST", path, {"schema": text})
            except _Refused as refused:
                raise self._refusal(subject, refused) from None
            registered = RegisteredSchema(int(answer["id"]), subject,
                                          int(looked.get("version", 0)), schema)
            self._registered[(subject, text)] = registered
            self._by_id.setdefault(registered.id, registered)
            return registered

    def get(self, schema_id: int) -> RegisteredSchema:
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        try:
            answer = self._call("GET", f"/schemas/ids/{schema_id}")
        except _Refused as refused:
            raise SchemaError(f"the log refers to schema id {schema_id}, which the registry at "
                              f"{self.url} does not give ({refused.status}: {refused.message})",
                              "point log.schema_registry.url at the registry the log was "
                              "written with") from None
        subject, version = "", 0
        try:
            where = self._call("GET", f"/schemas/ids/{schema_id}/versions")
            if where:
                subject, version = str(where[0]["subject"]), int(where[0]["version"])
        except _Refused:
            pass  # an older registry: the id's subject is not needed to decode
        found = RegisteredSchema(schema_id, subject, version, json.loads(answer["schema"]))
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def versions(self, subject: str) -> list[RegisteredSchema]:
        path = f"/subjects/{quote(subject, safe='')}/versions"
        try:
            numbers = self._call("GET", path)
        except _Refused as refused:
            if refused.status == 404:
                return []
            raise SchemaError(f"the schema registry at {self.url} refused to list {subject}: "
                              f"{refused.message}", "check the registry's permissions") from None
        out = []
        for number in numbers:
            answer = self._call("GET", f"{path}/{number}")
            found = RegisteredSchema(int(answer["id"]), subject, int(answer["version"]),
                                     json.loads(answer["schema"]))
            out.append(found)
            with self._lock:
                self._by_id.setdefault(found.id, found)
        return out

    def subjects(self) -> list[str]:
        return sorted(self._call("GET", "/subjects"))

    def close(self) -> None:
        """Nothing to release: each call is one HTTP request."""

    def _refusal(self, subject: str, refused: _Refused) -> SchemaError:
        if refused.status == INCOMPATIBLE:
            return SchemaError(
                f"the schema registry at {self.url} refused the new schema of {subject} as "
                f"incompatible: {refused.message}",
                "cdc's schemas follow the table (columns added, dropped, retyped): set the "
                f"subject's compatibility to NONE (PUT {self.url}/config/{subject} "
                '{"compatibility": "NONE"}), then start capture again; nothing was logged '
                "after the last acknowledged change")
        return SchemaError(f"the schema registry at {self.url} refused the schema of {subject} "
                           f"({refused.status}: {refused.message})",
                           "check the registry's permissions and log.schema_registry.url")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _message(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read() or b"{}")
    except ValueError:
        return str(error.reason)
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)[:1000]
    return str(body)[:1000]
