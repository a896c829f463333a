"""Storage error types; messages are already redacted and safe to print."""

from __future__ import annotations


class StorageError(Exception):
    """A storage problem with a message fit for an operator (no secrets, no traceback needed)."""


class SchemaTooNewError(StorageError):
    """The database was migrated by a newer tokwatch; this one refuses to write to it."""


class SchemaNotReadyError(StorageError):
    """The database has not been migrated (run `tokwatch db migrate`)."""


class StoreUnavailableError(StorageError):
    """The database cannot be reached right now (runs go to the outbox)."""
