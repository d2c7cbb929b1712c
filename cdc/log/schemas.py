"""The schema store kept beside the log: versioned Avro schemas per subject.

Subjects follow Confluent's naming: ``<topic>-value`` and ``<topic>-key``. Every distinct schema
gets a global id (1, 2, ...) and, per subject, a version (1, 2, ...). Registering a schema already
registered under the subject returns the existing id, so re-registering after a restart is free.

The store is one append-only JSON-lines file, ``schemas.jsonl``; each registration is fsynced
before :meth:`SchemaStore.register` returns, which is before any record using the id is appended,
so a committed record never refers to an unknown schema. A torn last line (a crash mid-write) is
ignored by readers and cut off by the next writer.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.errors import SchemaError, storage_error
from cdc.log.base import SchemaRegistry

SCHEMA_FILE = "schemas.jsonl"


def canonical(schema: Any) -> str:
    """A stable text for comparing schemas (key order does not matter)."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    subject: str
    version: int
    schema: Any


class SchemaStore(SchemaRegistry):
    """Reads (and, with ``writable=True``, appends to) ``<log dir>/schemas.jsonl``."""

    def __init__(self, directory: str | Path, writable: bool = False) -> None:
        self.file = Path(directory) / SCHEMA_FILE
        self.writable = writable
        self._lock = threading.Lock()
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_subject: dict[str, list[RegisteredSchema]] = {}
        self._by_text: dict[tuple[str, str], RegisteredSchema] = {}
        self._read_bytes = 0
        self._refresh()

    def _refresh(self) -> None:
        try:
            with open(self.file, "rb") as handle:
                handle.seek(self._read_bytes)
                data = handle.read()
        except FileNotFoundError:
            return
        complete = data.rfind(b"\n") + 1
        for line in data[:complete].splitlines():
            if line.strip():
                self._add(json.loads(line))
        self._read_bytes += complete
        if self.writable and complete < len(data):
            os.truncate(self.file, self._read_bytes)  # a torn line from a crashed writer

    def _add(self, entry: dict[str, Any]) -> RegisteredSchema:
        registered = RegisteredSchema(entry["id"], entry["subject"], entry["version"],
                                      entry["schema"])
        self._by_id[registered.id] = registered
        self._by_subject.setdefault(registered.subject, []).append(registered)
        self._by_text[(registered.subject, canonical(registered.schema))] = registered
        return registered

    def register(self, subject: str, schema: Any) -> RegisteredSchema:
        """The id and version of ``schema`` under ``subject``, registering it if new (durably)."""
        text = canonical(schema)
        with self._lock:
            found = self._by_text.get((subject, text))
            if found is not None:
                return found
            if not self.writable:
                raise SchemaError("cannot register a schema through a read-only schema store")
            self._refresh()
            found = self._by_text.get((subject, text))
            if found is not None:
                return found
            entry = {
                "id": max(self._by_id, default=0) + 1,
                "subject": subject,
                "version": len(self._by_subject.get(subject, [])) + 1,
                "schema": schema,
            }
            line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
            try:
                fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    written = os.write(fd, line)
                    if written != len(line):
                        raise OSError(errno.ENOSPC, "short write")
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, self._read_bytes)  # never leave half a line behind
                    raise
                finally:
                    os.close(fd)
            except OSError as exc:
                raise storage_error(f"register a schema for {subject}", exc) from None
            self._read_bytes += len(line)
            return self._add(entry)

    def get(self, schema_id: int) -> RegisteredSchema:
        """The schema with ``schema_id`` (re-reading the file if another process added it)."""
        found = self._by_id.get(schema_id)
        if found is None:
            with self._lock:
                self._refresh()
            found = self._by_id.get(schema_id)
        if found is None:
            raise SchemaError(f"schema id {schema_id} is not in {self.file}",
                              "the log and its schema store do not belong together: restore both "
                              "from the same copy")
        return found

    def versions(self, subject: str) -> list[RegisteredSchema]:
        with self._lock:
            self._refresh()
        return list(self._by_subject.get(subject, []))

    def subjects(self) -> list[str]:
        with self._lock:
            self._refresh()
        return sorted(self._by_subject)
