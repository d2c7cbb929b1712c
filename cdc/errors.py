"""One exception family for everything a user can get wrong or a machine can do to us.

Every error names three things: *what* went wrong, *where* (a config key, a file, a table), and
*how to fix it*. The CLI prints ``str(error)`` and exits non-zero; it never shows a traceback for a
:class:`CdcError`. Messages must never contain secrets: build them from redacted values only
(see :func:`cdc.config.redact_dsn`).
"""

from __future__ import annotations

import errno


class CdcError(Exception):
    """Base of every error this project raises on purpose.

    ``problem`` says what is wrong, ``fix`` says what the user can do about it.
    """

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        if self.fix:
            return f"{self.problem}\n  fix: {self.fix}"
        return self.problem


class ConfigError(CdcError):
    """The configuration file is missing, unreadable, not YAML, or fails validation."""

    exit_code = 2


class LogError(CdcError):
    """The change log cannot be opened, written or read."""


class LogUnavailable(LogError):
    """The log's storage went away for a while (brokers down or unreachable). The failed call
    committed nothing it reported; the writer resolves its own unfinished commit before it
    next reads its source offsets, so a capture that retries resumes from what is durable."""


class FollowerUnavailable(CdcError):
    """A follower's server went away for a while (down, restarting, unreachable). Nothing of
    the failed batch counts as applied: ``cdc apply`` waits, and resumes from its checkpoint
    (the version gate makes rewriting what did land a no-op)."""


class LogLockedError(LogError):
    """Another process holds the change log's writer lock."""


class LogCorruptError(LogError):
    """Bytes that were acknowledged as durable fail their checksum: the disk lost data."""


class FormatVersionError(LogError):
    """Stored state (the log, an offset, a follower's watermarks) was written by a newer cdc in
    a format this version does not read."""


def check_format(found: object, reads: int, what: str, *,
                 fix: str = "run the cdc version that wrote it (or a newer one)",
                 error: type[CdcError] | None = None) -> None:
    """Refuse stored state of a format this version does not read. ``found`` is the stored
    format number (state written before formats were marked is format 1: pass 1 for a missing
    marker); this version reads formats 1 to ``reads``. Anything else (a newer number, or not
    a number) raises ``error`` (default :class:`FormatVersionError`) naming ``what`` and the
    fix — stored state is never guessed at."""
    if isinstance(found, int) and not isinstance(found, bool) and 1 <= found <= reads:
        return
    newer = isinstance(found, int) and not isinstance(found, bool) and found > reads
    raise (error or FormatVersionError)(
        f"{what} has format {found!r}{', written by a newer cdc' if newer else ''}; this "
        f"version reads format {reads}{' and older' if reads > 1 else ''}", fix)


class SchemaError(CdcError):
    """A schema cannot be generated, registered or resolved."""


class EncodingError(CdcError):
    """A value cannot be encoded for its column type."""


def storage_error(action: str, exc: OSError) -> LogError:
    """A :class:`LogError` for a failed file operation, with the fix for the usual causes."""
    if exc.errno == errno.ENOSPC:
        return LogError(f"cannot {action}: the disk is full",
                        "free space on the log's filesystem (or move log.path), then restart; "
                        "nothing acknowledged was lost")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return LogError(f"cannot {action}: permission denied ({exc.filename or ''})",
                        "make the log directory writable by this user, or set log.path elsewhere")
    return LogError(f"cannot {action}: {exc.strerror or exc}",
                    "check the log directory's disk and permissions")
