"""API keys at the frontend: which requests may reach the router, and how many of them per key at once.

Where it sits: an ASGI middleware (`ApiKeyAuth`) in front of every route of `Frontend.app` but the probes'
and Prometheus' (`OPEN_PATHS`), so a request without a valid key never reaches validation, holding or a
worker, and never moves the metric contract the planner sizes from. Its keys come from a source that
replaces the whole key set when what it reads changes:

- `SecretKeys`: a Kubernetes Secret in the graph's namespace, every data value one key, watched with the
  frontend's ServiceAccount (`fleetpilot.informer`, one object selected by `metadata.name`, which RBAC
  authorizes against a Role rule restricted by `resourceNames`). Rotation is an edit of the Secret: add
  the new key, move the clients, remove the old one; the watch brings each change within a second or so,
  without a restart.
- `FileKeys`: a file of one key per line, for a frontend run outside Kubernetes; re-read when it changes.

It fails closed: until the source has been read, and while the Secret is missing or holds no key, every
request is refused with 401, and the log says why once per change of state.

Keys are never kept, logged or exported as text: a key set holds SHA-256 digests, a presented key is
hashed and compared with every digest by `hmac.compare_digest` (constant time, no early exit, so the
time taken says nothing of which key or how much of one matched), and the per-key in-flight count is
keyed by the digest. Refusals are counted by reason only (`FrontendMetrics.auth_refusals`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetpilot import informer, kube
from fleetpilot.frontend.validation import ApiError

logger = logging.getLogger("fleetpilot.frontend")

#: Routes served without a key: probes and Prometheus send none.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
#: What a 429 for a key at its in-flight limit tells the client to wait: a slot frees when one of its
#: requests finishes, which for a short completion is well under a second.
IN_FLIGHT_RETRY_AFTER_S = 1
#: How often `FileKeys` looks whether its file changed.
FILE_POLL_S = 1.0
#: Why a request was refused: the values of the refusal counter's `reason` label.
REASONS = ("missing_key", "invalid_key", "no_keys", "in_flight_limit")


def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


@dataclass(frozen=True)
class KeySet:
    """The keys in force, as SHA-256 digests (never the keys themselves). Pure."""

    digests: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, keys: Iterable[bytes | str]) -> KeySet:
        """A key set from key texts; surrounding whitespace (a trailing newline from `echo`) is not part of
        a key, and empty ones are left out. Duplicates count once."""
        found: dict[bytes, None] = {}
        for key in keys:
            raw = (key.encode() if isinstance(key, str) else key).strip()
            if raw:
                found[digest(raw)] = None
        return cls(tuple(found))

    def __len__(self) -> int:
        return len(self.digests)

    def match(self, presented: bytes) -> bytes | None:
        """The digest of the key in force that `presented` is, or None when it is none of them. Every
        digest is compared, whatever matched first, so the time taken does not depend on which key matched."""
        wanted = digest(presented)
        found = None
        for candidate in self.digests:
            if hmac.compare_digest(wanted, candidate):
                found = candidate
        return found


class Keys:
    """The key set a source last read (None: not read yet), replaced whole on each change. The base of
    every source, and on its own a source that tests and callers set by hand (`replace`)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin  # what the log names: "Secret ns/name", "file /path"
        self.current: KeySet | None = None
        self._state: tuple[str, tuple[bytes, ...]] | None = None
        self.changed = asyncio.Event()  # set at each replace: tests and callers wait on it

    def replace(self, keys: KeySet | None, *, missing: bool = False) -> None:
        """Put `keys` in force (None: not read yet). Logs once per change, never a key: the number of
        keys (again when the keys changed but not their number: a rotation), or why every request is
        refused."""
        self.current = keys
        if keys is None:
            state = f"API keys: {self.origin} not read yet; every request is refused with 401 until it is"
        elif missing:
            state = f"API keys: {self.origin} is missing; every request is refused with 401"
        elif not keys:
            state = f"API keys: {self.origin} holds no key; every request is refused with 401"
        else:
            state = f"API keys: {len(keys)} from {self.origin}"
        if (state, keys.digests if keys else ()) != self._state:
            self._state = (state, keys.digests if keys else ())
            logger.log(logging.INFO if keys else logging.WARNING, "%s", state)
        self.changed.set()
        self.changed = asyncio.Event()

    async def start(self) -> None:
        """Begin reading the source (nothing to read for keys set by hand)."""

    async def stop(self) -> None:
        """Stop reading the source."""


def secret_keys(secret: dict[str, Any]) -> KeySet:
    """Every data value of a Secret (base64 on the wire) is one key; data keys name them only. A value
    that is not base64 is left out, and the log names its data key, never its content."""
    keys = []
    for name, value in sorted((secret.get("data") or {}).items()):
        try:
            keys.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError, TypeError):
            logger.warning("API keys: data key %r of the Secret is not base64; left out", name)
    return KeySet.of(keys)


def _secret_without_extras(secret: dict[str, Any]) -> dict[str, Any]:
    """What the informer keeps of the Secret: its identity and data. Annotations may carry a copy of the
    data (kubectl's last-applied-configuration) and are never read here."""
    meta = secret.get("metadata", {})
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
            "data": secret.get("data") or {}}


class SecretKeys(Keys):
    """Keys from one Secret in one namespace, kept current by a watch of that Secret alone."""

    def __init__(self, api: kube.KubeApi, *, namespace: str, name: str) -> None:
        super().__init__(f"Secret {namespace}/{name}")
        self.api = api
        self._informer = informer.Informer(
            api, "Secret", namespace=namespace, field_selector=f"metadata.name={name}",
            store=informer.Store(transform=_secret_without_extras), on_event=self._update)
        self._synced: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.replace(None)
        await self._informer.start()
        self._synced = asyncio.create_task(self._after_first_list())

    async def stop(self) -> None:
        if self._synced is not None:
            self._synced.cancel()
            await asyncio.gather(self._synced, return_exceptions=True)
        await self._informer.stop()

    async def _after_first_list(self) -> None:
        # A first List without the Secret delivers no event (nothing changed in the empty store): say so.
        await self._informer.synced.wait()
        if self.current is None:
            self.replace(KeySet(), missing=True)

    def _update(self, event_type: str, secret: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self.replace(KeySet(), missing=True)
        else:
            self.replace(secret_keys(secret))


def file_keys(text: str) -> KeySet:
    """One key per line; blank lines and lines starting with # are not keys."""
    return KeySet.of(line for line in text.splitlines() if not line.strip().startswith("#"))


class FileKeys(Keys):
    """Keys from a file, read at start and again whenever its modification time or size changes."""

    def __init__(self, path: Path, *, poll_s: float = FILE_POLL_S) -> None:
        super().__init__(f"file {path}")
        self.path = path
        self.poll_s = poll_s
        self._seen: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def read(self) -> None:
        """Read the file if it changed since the last read; a missing file is no key."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._seen = None
            self.replace(KeySet(), missing=True)
            return
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen or self.current is None:
            self._seen = seen
            self.replace(file_keys(self.path.read_text()))

    async def start(self) -> None:
        self.read()
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.read()
            except OSError as error:  # unreadable for a moment (being replaced): keep the keys in force
                logger.warning("API keys: %s unreadable: %s", self.origin, error.strerror)


def bearer(headers: Headers) -> bytes | None:
    """The key of an `Authorization: Bearer <key>` header, as the bytes the client sent; None without one."""
    scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    # Starlette decodes header bytes as latin-1: encoding back gives the bytes that came on the wire.
    return credentials.strip().encode("latin-1")


def unauthorized(reason: str) -> ApiError:
    """OpenAI's 401 for a request without a valid key (its message never repeats the key)."""
    messages = {
        "missing_key": ("no API key given: send it in an Authorization header with Bearer auth "
                        "(Authorization: Bearer <key>)"),
        "invalid_key": "the API key given is not valid for this frontend",
        "no_keys": ("this frontend has no API key in force (its key Secret is missing, empty or not read yet), so "
                    "every request is refused; its log says why"),
    }
    return ApiError(messages[reason], status=401, type="invalid_request_error", code="invalid_api_key")


def over_limit(limit: int) -> ApiError:
    """OpenAI's 429 for a key with `limit` requests in flight already."""
    return ApiError(f"this API key has {limit} requests in flight, the most it may; retry after "
                    f"{IN_FLIGHT_RETRY_AFTER_S} s or when one of them finishes", status=429, type="requests",
                    code="rate_limit_exceeded", retry_after_s=IN_FLIGHT_RETRY_AFTER_S)


class ApiKeyAuth:
    """ASGI middleware: a request to any route but `OPEN_PATHS` needs a key of `keys`, and, with
    `max_in_flight`, finds fewer than that many of its key's requests in flight (counted from the moment
    it passes here until the app has sent its last byte, a stream's too)."""

    def __init__(self, app: ASGIApp, *, keys: Keys, max_in_flight: int | None = None,
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.keys = keys
        self.max_in_flight = max_in_flight
        self.on_refused = on_refused
        self.in_flight: dict[bytes, int] = defaultdict(int)  # by key digest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        keys = self.keys.current
        presented = bearer(Headers(scope=scope))
        if not keys:
            await self._refuse("no_keys", scope, receive, send)
            return
        if presented is None:
            await self._refuse("missing_key", scope, receive, send)
            return
        identity = keys.match(presented)
        if identity is None:
            await self._refuse("invalid_key", scope, receive, send)
            return
        if self.max_in_flight is not None and self.in_flight[identity] >= self.max_in_flight:
            await self._refuse("in_flight_limit", scope, receive, send)
            return
        self.in_flight[identity] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[identity] -= 1
            if not self.in_flight[identity]:
                del self.in_flight[identity]  # a key rotated away leaves nothing behind

    async def _refuse(self, reason: str, scope: Scope, receive: Receive, send: Send) -> None:
        if self.on_refused is not None:
            self.on_refused(reason)
        error = over_limit(self.max_in_flight or 0) if reason == "in_flight_limit" else unauthorized(reason)
        headers = {}
        if error.retry_after_s is not None:
            headers["Retry-After"] = str(error.retry_after_s)
        if error.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="fleetpilot"'  # RFC 6750: the scheme a 401 wants
        request_id = Headers(scope=scope).get("x-request-id")
        if request_id:
            headers["x-request-id"] = request_id
        response = JSONResponse(error.body(), status_code=error.status, headers=headers)
        await response(scope, receive, send)

