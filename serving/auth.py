"""API-key authentication as a FastAPI dependency.

A key arrives as ``X-API-Key: <key>`` or ``Authorization: Bearer <key>``. Keys are compared
with ``hmac.compare_digest`` against every configured key, without stopping at the first
match, so the response time says nothing about how much of a guess was right, nor which key
matched. Keys are never logged.
"""
from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from serving.dependencies import get_settings
from serving.settings import Settings

API_KEY_HEADER = "X-API-Key"

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


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail=message,
                         headers={"WWW-Authenticate": f'Bearer, ApiKey header="{API_KEY_HEADER}"'})


async def require_api_key(
    settings: Annotated[Settings, Depends(get_settings)],
    header_key: Annotated[str | None, Depends(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Passes when auth is off (--no-auth) or the request carries a configured key; else 401."""
    if settings.no_auth:
        return
    check_key(settings, header_key if header_key is not None else (bearer.credentials if bearer is not None else None))


async def require_metrics_key(
    settings: Annotated[Settings, Depends(get_settings)],
    header_key: Annotated[str | None, Depends(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Like require_api_key, unless --open-metrics: at low traffic the counters show one request's outcome."""
    if not settings.open_metrics:
        await require_api_key(settings, header_key, bearer)


def check_key(settings: Settings, candidate: str | None) -> None:
    """Raises 401 unless candidate is one of the configured keys (auth on)."""
    if not candidate:
        raise _unauthorized(f"missing API key: send it in the {API_KEY_HEADER} header or as "
                            f"'Authorization: Bearer <key>'")
    keys = tuple(k.get_secret_value() for k in settings.api_keys)
    if not key_matches(candidate, keys):
        raise _unauthorized("invalid API key")
