"""gcp-storage-emulator with GCS's generation preconditions: run as a script in place of
`python -m gcp_storage_emulator` (same arguments).

The emulator (2026.7.19) ignores `ifGenerationMatch`: every conditional write succeeds, so a
test of "two writers cannot both win" could not fail there. This wraps its object-insert and
object-delete handlers, inside the emulator process, with the check real GCS makes, as
documented in https://cloud.google.com/storage/docs/request-preconditions and the JSON API
reference for objects.insert / objects.delete (parameter `ifGenerationMatch`):

- the request succeeds only when the live object's generation equals the value;
- `ifGenerationMatch=0` succeeds only when there is no live object of that name;
- otherwise GCS answers 412 Precondition Failed, error reason `conditionNotMet`, and writes
  nothing (google-cloud-storage raises google.api_core.exceptions.PreconditionFailed).

Single-request uploads (media, multipart) and deletes are modelled: what the artifact store
sends. Preconditions this fake does not model (resumable uploads with ifGenerationMatch,
ifGenerationNotMatch, the metageneration ones) get 501, so nothing silently passes unchecked.
A zero-byte media upload, which the emulator cannot store, is stored (_empty_media).
The emulator serves one request at a time (http.server.HTTPServer), so the check and the write
cannot interleave with another request — as GCS makes them atomic.
"""

from __future__ import annotations

import sys
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

UNMODELLED = ("ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch")
# The error body GCS sends with a 412 (JSON API error format).
FAILED = {"error": {"code": 412, "message": "At least one of the pre-conditions you specified "
                    "did not hold.", "errors": [{"domain": "global", "reason": "conditionNotMet",
                                                 "message": "At least one of the pre-conditions "
                                                 "you specified did not hold.",
                                                 "locationType": "header",
                                                 "location": "If-Match"}]}}


def _object_name(request: Any) -> str | None:
    if "name" in request.query:
        return str(request.query["name"][0])
    if (request.params or {}).get("object_id"):
        return str(request.params["object_id"])
    data = request.data  # the emulator caches the parsed body: its handler reads it again
    if isinstance(data, dict) and isinstance(data.get("meta"), dict):
        return data["meta"].get("name")
    return None


def _refused(request: Any, response: Any, storage: Any) -> bool:
    """True when the request's precondition fails (the response is then the error)."""
    if any(k in request.query for k in UNMODELLED) or (
            "ifGenerationMatch" in request.query
            and request.query.get("uploadType", [""])[0] == "resumable"):
        response.status = HTTPStatus.NOT_IMPLEMENTED
        response.json({"error": {"code": 501, "message": "precondition not modelled by "
                                 "tests/support/gcs_preconditions.py"}})
        return True
    if "ifGenerationMatch" not in request.query:
        return False
    want = int(request.query["ifGenerationMatch"][0])
    try:
        live = int(storage.get_file_obj(request.params["bucket_name"],
                                        _object_name(request))["generation"])
    except NotFound:
        live = 0  # "0: there is no live version of the object"
    if live == want:
        return False
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json(FAILED)
    return True


def _checked(handler: Any) -> Any:
    def run(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        if not _refused(request, response, storage):
            return handler(request, response, storage, *args, **kwargs)
        return None

    return run


def _empty_media(handler: Any) -> Any:
    """GCS stores a zero-byte object (a download folder's lock files are empty); the emulator
    reads an empty body as None and its media upload fails on len(None): the body is b""."""
    def run(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        if request.query.get("uploadType", [""])[0] == "media" and request.data is None:
            request._data = b""
        return handler(request, response, storage, *args, **kwargs)

    return run


def install() -> None:
    """Wrap the routes' insert and delete handlers (the route table holds the functions)."""
    wrapped = {objects.insert: _checked(_empty_media(objects.insert)),
               objects.delete: _checked(objects.delete)}
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in wrapped:
                handlers[method] = wrapped[handler]
    objects.insert = wrapped[objects.insert]  # the router's fallback for uploads without /upload


if __name__ == "__main__":
    install()
    sys.exit(main())
