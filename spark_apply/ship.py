"""Shipping ``cdc apply`` to a cluster: the code and its Python dependencies as one archive that
Spark hands to every executor (``spark.archives``), so a worker needs only a Python of the same
minor version (``python3`` on its ``PATH``, or ``spark.pyspark.python``) and nothing of ours.

What the archive holds: the ``cdc`` distribution (its packages, compiled kernels and data files,
and its ``dist-info``, so entry points, the plugins, work on executors), every distribution that
registers a plugin (``cdc.connectors``, ``cdc.followers``), and all they require — with the
``spark`` extra — except pyspark and py4j, which Spark itself puts on the executors' path. It
is laid out as a ``site-packages`` folder; executors unpack it into their working directory as
``cdcenv`` and find it through ``spark.executorEnv.PYTHONPATH``. An editable install's packages
are taken from its source folders.

:func:`pack` builds the archive once per set of installed files (a digest of their names, sizes
and times names it) under ``~/.cache/cdc/packs`` (``$CDC_PACK_DIR``); concurrent callers wait
for the first under a lock. ``cdc pack`` writes one for ``spark-submit --archives``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import zipfile
from collections.abc import Iterator
from importlib.metadata import Distribution, entry_points
from importlib.metadata import distributions as installed
from importlib.util import find_spec
from pathlib import Path

from cdc.plugins import FOLLOWER_GROUP, SOURCE_GROUP

#: the folder executors unpack the archive into (and put on their PYTHONPATH)
UNPACKED = "cdcenv"
#: Spark puts these on every Python worker's path itself (their requirements are shipped)
PROVIDED = frozenset({"pyspark", "py4j"})
#: the extras the executors need: the project's Spark followers, pyspark's SQL (Arrow, pandas)
EXTRAS = {"cdc": {"spark"}, "pyspark": {"sql"}}
PACK_ENV = "CDC_PACK_DIR"


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def distributions() -> list[Distribution]:
    """``cdc``, the plugins' distributions and everything they require (extras as
    :data:`EXTRAS` says), without :data:`PROVIDED`; sorted by name."""
    from packaging.requirements import Requirement

    roots = {"cdc"} | {point.dist.name for group in (SOURCE_GROUP, FOLLOWER_GROUP)
                       for point in entry_points(group=group) if point.dist is not None}
    found: dict[str, Distribution] = {}
    todo = [(name, frozenset(EXTRAS.get(_key(name), ()))) for name in roots]
    while todo:
        name, extras = todo.pop()
        if _key(name) in found:
            continue
        dist = _installed(name)
        if dist is None:
            continue  # an optional requirement not installed
        if _key(name) not in PROVIDED:
            found[_key(name)] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return [found[k] for k in sorted(found)]


def _installed(name: str) -> Distribution | None:
    """The installed distribution ``name``: one with a RECORD (not an ``.egg-info`` a build
    left in the working directory, which lists sources rather than installed files)."""
    candidates = list(installed(name=name))
    return next((d for d in candidates if d.read_text("RECORD") is not None),
                candidates[0] if candidates else None)


def _editable(dist: Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    return bool(text and json.loads(text).get("dir_info", {}).get("editable"))


def archive_files() -> Iterator[tuple[Path, str]]:
    """(file on disk, its path in the archive) of everything :func:`pack` ships."""
    for dist in distributions():
        editable = _editable(dist)
        for entry in dist.files or []:
            path = Path(str(dist.locate_file(entry)))
            name = entry.as_posix()
            if (name.startswith("..") or "__pycache__" in name or name.endswith(".pth")
                    or "__editable__" in name or not path.is_file()):
                continue
            yield path, name
        if editable:
            yield from _source_packages(dist)


def _source_packages(dist: Distribution) -> Iterator[tuple[Path, str]]:
    """The packages of an editable install, from their source folders (no caches, no C
    sources Cython generated)."""
    for package in (dist.read_text("top_level.txt") or "").split():
        spec = find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".c":
                yield path, f"{package}/{path.relative_to(root).as_posix()}"


def pack_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get(PACK_ENV) or Path(cache) / "cdc" / "packs")


def pack(folder: Path | None = None) -> Path:
    """The archive of :func:`archive_files` (made now unless one of the same files exists)."""
    files = sorted(archive_files(), key=lambda item: item[1])
    digest = hashlib.sha256()
    for path, name in files:
        stat = path.stat()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    folder = folder or pack_dir()
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"cdc-env-{digest.hexdigest()[:16]}.zip"
    lock = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.exists():
            partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as out:
                for path, name in files:
                    out.write(path, name)
            os.replace(partial, archive)
    finally:
        os.close(lock)
    return archive


def ship_settings(archive: Path) -> dict[str, str]:
    """The Spark settings that hand ``archive`` to every executor and put it on their path."""
    return {"spark.archives": f"{archive}#{UNPACKED}",
            "spark.executorEnv.PYTHONPATH": UNPACKED}
