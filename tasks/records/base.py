"""The base of every record: `_Strict` (unknown keys are errors), `_Given` (dumps only the keys
it was given) and `Record` (a schema version, migration on load, atomic save)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from tasks.shared.errors import RecordError, explain_validation
from tasks.shared.files import write_atomic


class _Strict(BaseModel):
    """Unknown keys are errors; assignments are validated like construction."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class _Given(_Strict):
    """A part whose dumps hold the keys it was given only, however it is dumped (whole, inside
    another record, by Prefect): the shape of the dicts written before it, where a key was
    present only when it applied."""

    @model_serializer(mode="wrap")
    def _given_keys_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class Record(_Strict):
    """A record with a schema version, written to and read from JSON."""

    SCHEMA_VERSION: ClassVar[int] = 1
    # False: the dump leaves out the fields never set (the run summary: a key appears once
    # its phase wrote it, as in the files written before the models).
    WRITE_UNSET: ClassVar[bool] = True

    schema_version: int = 1

    @model_validator(mode="before")
    @classmethod
    def _check_version(cls, data: Any) -> Any:
        if isinstance(data, dict):
            found = data.get("schema_version")
            if found is None:  # written before records were versioned: today's shape
                data = {**cls.migrate_unversioned(dict(data)), "schema_version": cls.SCHEMA_VERSION}
            elif found != cls.SCHEMA_VERSION:
                data = {**cls.migrate(dict(data), found), "schema_version": cls.SCHEMA_VERSION}
        return data

    @model_validator(mode="after")
    def _version_always_written(self) -> Self:
        self.model_fields_set.add("schema_version")
        return self

    @classmethod
    def migrate_unversioned(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A record written before `schema_version` existed, in the current shape."""
        return data

    @classmethod
    def migrate(cls, data: dict[str, Any], found: Any) -> dict[str, Any]:
        """A record of the older version `found`, in the current shape; RecordError for a
        version this code does not read (a newer one, or one without a migration)."""
        raise RecordError(version_message(cls, found))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (what flows return and artifacts carry)."""
        return self.model_dump(mode="json", exclude_unset=not self.WRITE_UNSET)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_unset=not self.WRITE_UNSET)

    def save(self, path: Path) -> Path:
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def parse(cls, data: Any, where: str) -> Self:
        """Validate a dict (read from `where`: a file, an artifact) into the record."""
        try:
            return cls.model_validate(data)
        except RecordError as e:  # a version this code does not read (raised as it is)
            raise RecordError(f"{where}: {e}") from None
        except ValidationError as e:
            raise RecordError(explain_validation(
                e, f"{where}: not a valid {cls.__name__} (schema_version "
                f"{cls.SCHEMA_VERSION}):", "Fix or remove the file; a misspelled key is an "
                "error, not ignored.")) from None

    @classmethod
    def load(cls, path: Path) -> Self:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise RecordError(f"{path}: not JSON ({e}) — fix or remove the file") from None
        return cls.parse(data, str(path))


def version_message(cls: type[Record], found: Any) -> str:
    return (f"{cls.__name__} schema_version {found!r} found, version {cls.SCHEMA_VERSION} "
            "expected (files without a schema_version are read as today's shape) — written "
            "by another version of slm-nightly: run that version, or move the file away")
