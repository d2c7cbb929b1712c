"""`cdc registry serve`'s answers (cdc_app/registry.py) over a real HTTP socket, from a log's
schema store: the Schema Registry API subset consumers decode with, its error codes, and
read-only. (confluent-kafka's own client against it: tests/test_kafka_log.py.)"""

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cdc.log.schemas import SchemaStore, canonical
from cdc_app.registry import make_server


def _record(*fields: str) -> dict[str, Any]:
    return {"type": "record", "name": "Value", "namespace": "s.public.t",
            "fields": [{"name": f, "type": "long"} for f in fields]}


@pytest.fixture
def registry(tmp_path: Path) -> Any:
    store = SchemaStore(tmp_path, writable=True)
    first = store.register("s.public.t-value", _record("id"))
    second = store.register("s.public.t-value", _record("id", "v"))
    server = make_server(SchemaStore(tmp_path), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", first, second, store
    server.shutdown()
    server.server_close()


def _get(url: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method, data=b"{}" if method != "GET" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_registry_serves_subjects_versions_and_ids(registry: Any) -> None:
    url, first, second, store = registry
    assert _get(f"{url}/subjects") == (200, ["s.public.t-value"])
    assert _get(f"{url}/subjects/s.public.t-value/versions") == (200, [1, 2])
    status, latest = _get(f"{url}/subjects/s.public.t-value/versions/latest")
    assert status == 200 and latest == {"subject": "s.public.t-value", "version": 2,
                                         "id": second.id, "schema": canonical(second.schema)}
    assert _get(f"{url}/subjects/s.public.t-value/versions/1")[1]["id"] == first.id
    assert _get(f"{url}/schemas/ids/{first.id}") == (200, {"schema": canonical(first.schema)})
    assert _get(f"{url}/schemas/ids/{second.id}/versions") == (
        200, [{"subject": "s.public.t-value", "version": 2}])
    later = store.register("s.public.u-value", _record("k"))  # registered while it serves
    assert _get(f"{url}/schemas/ids/{later.id}")[0] == 200


def test_the_registry_answers_errors_in_its_own_form_and_is_read_only(registry: Any) -> None:
    url, *_ = registry
    assert _get(f"{url}/subjects/nope-value/versions")[1]["error_code"] == 40401
    assert _get(f"{url}/subjects/s.public.t-value/versions/9")[1]["error_code"] == 40402
    assert _get(f"{url}/schemas/ids/424242")[1]["error_code"] == 40403
    status, body = _get(f"{url}/subjects/s.public.t-value/versions", method="POST")
    assert status == 405 and "read-only" in body["message"]
