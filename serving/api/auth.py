"""API-key authentication: the app's AuthGuard, and the FastAPI dependencies that call it.

A key arrives as ``X-API-Key: <key>`` or ``Authorization: Bearer <key>``. Keys are compared
with ``hmac.compare_digest`` against every configured key, without stopping at the first
match, so the response time says nothing about how much of a guess was right, nor which key
matched. Keys are never logged.

Failed attempts (no key or a wrong one) are counted per client address: past
``Settings.auth_failures`` within ``auth_window_s`` the address is answered 429 with Retry-After,
its key not even checked, so a right guess while it waits wins nothing. Each failure is logged
with the client address (uvicorn's: the peer, or X-Forwarded-For from a proxy it trusts) and the
request id. The guard is built once per app (``create_app``) and shared by the body middleware,
which checks before reading a body, and the route dependencies.
"""
from __future__ import annotations

import collections
import hmac
import logging
import math
import time
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from serving.api.dependencies import get_settings
from serving.settings import Settings
from serving.monitoring.telemetry import ServiceMetrics

logger = logging.getLogger(__name__)

API_KEY_HEADER = "X-API-Key"
# Addresses whose failures are remembered; the oldest is forgotten first. Each holds at most
# --auth-failures timestamps, so the table stays under a few MiB however many addresses try.
MAX_TRACKED_ADDRESSES = 10_000

# auto_error=False: we answer missing keys ourselves, with one message for both schemes.
_api_key_header = APIKeyHeader(name=API_KEY_HEADER, auto_error=False,
                               description="An API key from EHR_API_KEYS or --api-keys-file.")
_bearer = HTTPBearer(auto_error=False, description="The same API key, as a bearer token.")


def key_matches(candidate: str, keys: tuple[str, ...]) -> bool:
    """True if candidate equals one of keys; constant time in the candidate's content."""
    given = candidate.encode("utf-8", "surrogatepass")
    found = False
    for key in keys:  # no early exit: the loop takes as long whichever key matches
        found |= hmac.compare_digest(given, key.encode("utf-8"))
    return found


class FailureWindow:
    """Failures per address in a sliding window of window_s; an address with `limit` of them waits.

    After the wait one more attempt is allowed per failure that leaves the window, so an address
    makes at most `limit` failed attempts in any window_s. Only the event loop touches it (the
    middleware and async dependencies), so it needs no lock.
    """

    def __init__(self, limit: int, window_s: float, max_addresses: int = MAX_TRACKED_ADDRESSES):
        self.limit, self.window_s, self.max_addresses = limit, window_s, max_addresses
        self._times: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def _recent(self, address: str, now: float) -> collections.deque[float]:
        # The last `limit` failures are all the rule needs: the oldest of them says when the next may come.
        times = self._times.get(address, collections.deque(maxlen=self.limit))
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def wait_s(self, address: str, now: float) -> float:
        """Seconds until the address may try again (0: it may try now)."""
        if self.limit == 0 or address not in self._times:
            return 0.0
        times = self._recent(address, now)
        if not times:
            del self._times[address]
            return 0.0
        return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def record(self, address: str, now: float) -> int:
        """Counts one failure of the address; returns its failures in the window, this one included (0: no limit)."""
        if self.limit == 0:
            return 0
        times = self._recent(address, now)
        times.append(now)
        self._times[address] = times
        self._times.move_to_end(address)
        while len(self._times) > self.max_addresses:
            self._times.popitem(last=False)
        return len(times)


def client_address(scope: Scope) -> str:
    """The client's address as uvicorn reports it ('unknown' when the server gives none, e.g. a Unix socket)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class AuthGuard:
    """The app's key check: 401 for a missing or wrong key, 429 for an address out of its failure budget."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics):
        self.no_auth = settings.no_auth
        self.keys = tuple(k.get_secret_value() for k in settings.api_keys)
        self.failures = FailureWindow(settings.auth_failures, settings.auth_window_s)
        self.metrics = metrics

    def check(self, candidate: str | None, scope: Scope) -> None:
        """Passes a configured key (or any request with auth off); else raises 401 or 429, counted and logged."""
        if self.no_auth:
            return
        address, now = client_address(scope), time.monotonic()
        wait = self.failures.wait_s(address, now)
        if wait > 0:
            self.metrics.auth_failures.labels(reason="limited").inc()
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"too many failed authentications from this address; retry in {math.ceil(wait)} s",
                                headers={"Retry-After": str(math.ceil(wait))})
        if candidate and key_matches(candidate, self.keys):
            return
        reason = "invalid" if candidate else "missing"
        count = self.failures.record(address, now)
        self.metrics.auth_failures.labels(reason=reason).inc()
        budget = f" failures={count}/{self.failures.limit} in {self.failures.window_s:g} s" if count else ""
        limited = "; limited: its requests get 429 for now" if 0 < self.failures.limit <= count else ""
        logger.warning("auth_failed client=%s reason=%s request_id=%s%s%s", address, reason,
                       scope.get("state", {}).get("request_id", "-"), budget, limited)
        if reason == "missing":
            raise _unauthorized(f"missing API key: send it in the {API_KEY_HEADER} header or as "
                                f"'Authorization: Bearer <key>'")
        raise _unauthorized("invalid API key")


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail=message,
                         headers={"WWW-Authenticate": f'Bearer, ApiKey header="{API_KEY_HEADER}"'})


def get_auth_guard(request: Request) -> AuthGuard:
    """The app's AuthGuard."""
    return request.app.state.auth


async def require_api_key(
    request: Request,
    guard: Annotated[AuthGuard, Depends(get_auth_guard)],
    header_key: Annotated[str | None, Depends(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Passes when auth is off (--no-auth) or the request carries a configured key; else 401 (or 429)."""
    guard.check(header_key if header_key is not None else (bearer.credentials if bearer is not None else None),
                request.scope)


async def require_metrics_key(
    request: Request,
    settings: Annotated[Settings, Depends(get_settings)],
    guard: Annotated[AuthGuard, Depends(get_auth_guard)],
    header_key: Annotated[str | None, Depends(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Like require_api_key, unless --open-metrics: at low traffic the counters show one request's outcome."""
    if not settings.open_metrics:
        await require_api_key(request, guard, header_key, bearer)
