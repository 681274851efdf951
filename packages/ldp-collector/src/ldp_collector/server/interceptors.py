"""The server's interceptors: bearer-token authentication, the per-token rate limit, and the
INVALID_ARGUMENT answer to undecodable requests of the standard services (health, reflection).

Order (see :mod:`ldp_collector.server.lifecycle`): :class:`BearerTokenInterceptor` first, so a call
refused for its token never reaches the other two; then :class:`UndecodableRequestInterceptor`,
then :class:`RateLimitInterceptor` when a token rate limit is configured. Tokens are compared in
constant time (hashes of equal length via :func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.rpc import status_pb2  # type: ignore[import-untyped]

from ..defences import EnrolmentAuthority
from ..errors import ErrorReason, InvalidArgumentError, UnauthenticatedError
from ..ratelimit import RateLimitedError, RateLimiter
from ..telemetry import CollectorMetrics
from .status import Context, abort, status_for_error
from .wire import DEVICE_SERVICE, OPERATOR_SERVICE

__all__ = [
    "BearerTokenInterceptor",
    "RateLimitInterceptor",
    "ServerInterceptor",
    "UndecodableRequestInterceptor",
    "bearer_digest",
    "bearer_token",
]

log = logging.getLogger(__name__)

#: A refused call is logged at most once per this many seconds (with the count since the last line).
_LOG_EVERY_S = 10.0
_ENROLL_METHOD = f"/{DEVICE_SERVICE}/Enroll"

#: The base class of a ``grpc.aio`` server interceptor (generic for the type checker only).
if TYPE_CHECKING:
    ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # not subscriptable at run time
    ServerInterceptor = grpc.aio.ServerInterceptor


# -- refusals and undecodable requests -----------------------------------------------------------

class _RefusalLog:
    """Logs refused calls at most once per ``_LOG_EVERY_S``, with the number refused since the last
    line: a flood of refused calls must not flood the logs too."""

    def __init__(self) -> None:
        self._refused = 0
        self._last_log = -_LOG_EVERY_S

    def note(self, method: str, problem: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            log.warning("refused %s: %s", method, problem,
                        extra={"method": method, "refused_since_last_log": self._refused})
            self._refused = 0
            self._last_log = now


class UndecodableRequestInterceptor(ServerInterceptor):
    """Answer INVALID_ARGUMENT to requests of the standard services (health, reflection) that do not
    parse, and log them as refusals.

    gRPC itself answers such a request UNKNOWN with the parser's text and logs a traceback per
    message, so garbage sent to the health check would fill the logs. This wraps every handler that
    has a request deserializer (the collector's own services parse their bytes themselves and answer
    INVALID_ARGUMENT already): the request's bytes are parsed in the wrapper, and a failure aborts
    the call and is noted in a :class:`_RefusalLog`.

    Parameters
    ----------
    metrics : CollectorMetrics
        Refused requests are counted as ``INVALID_ARGUMENT`` calls of their method.
    """

    def __init__(self, metrics: CollectorMetrics) -> None:
        self._metrics = metrics
        self._refusals = _RefusalLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method, parse = handler_call_details.method, handler.request_deserializer
        refusals, metrics = self._refusals, self._metrics

        def decode(data: bytes) -> tuple[Any, status_pb2.Status | None]:
            """The parsed request, or the status refusing it (the caller aborts: see ``_unary_handler``)."""
            try:
                return parse(data), None
            except Exception as exc:  # the protobuf parser's DecodeError, or whatever a custom one raises
                problem = f"malformed request: {exc}"
            refusals.note(method, problem)
            metrics.rpcs.labels(method=method.lstrip("/"), code="INVALID_ARGUMENT").inc()
            return None, status_for_error(InvalidArgumentError(problem, reason=ErrorReason.MALFORMED_REQUEST))

        async def decode_one(data: bytes, context: Context) -> Any:
            request, refused = decode(data)
            del data
            if refused is not None:
                await abort(context, refused)
            return request

        async def decode_stream(raw: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            async def requests() -> AsyncIterator[Any]:
                async for data in raw:
                    request, refused = decode(data)
                    del data
                    if refused is not None:
                        await abort(context, refused)
                    yield request

            return requests()

        serialize = handler.response_serializer
        prepare: Callable[[Any, Context], Awaitable[Any]]
        if handler.request_streaming:
            inner, prepare = handler.stream_stream or handler.stream_unary, decode_stream
        else:
            inner, prepare = handler.unary_stream or handler.unary_unary, decode_one
        behavior = _with_request(inner, prepare)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(behavior, response_serializer=serialize)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(behavior, response_serializer=serialize)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(behavior, response_serializer=serialize)
        return grpc.unary_unary_rpc_method_handler(behavior, response_serializer=serialize)


def _with_request(inner: Any, prepare: Callable[[Any, Context], Awaitable[Any]]) -> Callable[..., Any]:
    """A behavior calling ``inner(await prepare(request, context), context)``, of ``inner``'s kind:
    an async generator when it is one, else a coroutine (which may write with ``context.write``)."""
    if inspect.isasyncgenfunction(inner):
        async def generator(request: Any, context: Context) -> AsyncIterator[Any]:
            prepared = prepare(request, context)
            del request  # not held by this frame while ``prepare`` may abort the call
            async for item in inner(await prepared, context):
                yield item

        return generator

    async def coroutine(request: Any, context: Context) -> Any:
        prepared = prepare(request, context)
        del request  # not held by this frame while ``prepare`` may abort the call
        return await inner(await prepared, context)

    return coroutine


# -- authentication -----------------------------------------------------------------------------

def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class BearerTokenInterceptor(ServerInterceptor):
    """Require ``authorization: Bearer <token>`` on the methods of the protected services.

    Parameters
    ----------
    tokens_by_service : mapping of str to sequence of str
        Fully qualified service name -> accepted tokens. Services not listed (health,
        reflection, and ``DeviceService`` without device tokens or enrolment) are open.
    metrics : CollectorMetrics
    device_authority : EnrolmentAuthority, optional
        With enrolment on: ``DeviceService`` also accepts the device tokens this authority
        verifies (and is protected even without static device tokens), and ``Enroll`` is open.
    """

    def __init__(self, tokens_by_service: dict[str, Sequence[str]], metrics: CollectorMetrics, *,
                 device_authority: EnrolmentAuthority | None = None) -> None:
        self._digests = {f"/{service}/": tuple(_digest(t) for t in tokens)
                         for service, tokens in tokens_by_service.items() if tokens}
        self._authority = device_authority
        if device_authority is not None:
            self._digests.setdefault(f"/{DEVICE_SERVICE}/", ())
        self._metrics = metrics
        self._refusals = _RefusalLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        prefix = method[: method.rfind("/") + 1]
        accepted = self._digests.get(prefix)
        handler = await continuation(handler_call_details)
        if accepted is None or handler is None or method == _ENROLL_METHOD:
            return handler
        authority = self._authority if prefix == f"/{DEVICE_SERVICE}/" else None
        problem = self._check(handler_call_details.invocation_metadata, accepted, authority)
        if problem is None:
            return handler
        service = prefix.strip("/")
        self._metrics.auth_failures.labels(service=service).inc()
        self._refusals.note(method, problem)
        return _deny(handler, problem)

    @staticmethod
    def _check(metadata: Any, accepted: tuple[bytes, ...], authority: EnrolmentAuthority | None = None) -> str | None:
        """``None`` when the metadata carries an accepted bearer token (a configured one, or one
        ``authority`` issued), else what is wrong."""
        values = [value for key, value in (metadata or ()) if key == "authorization"]
        if not values:
            return "missing authorization metadata (expected 'Bearer <token>')"
        if len(values) > 1:
            return "more than one authorization header"
        value = values[0]
        if isinstance(value, bytes):
            return "authorization must be text"
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "authorization must be 'Bearer <token>'"
        presented = _digest(token.strip())
        ok = False
        for digest in accepted:  # no early exit: the time does not depend on which token matched
            ok |= hmac.compare_digest(presented, digest)
        if not ok and authority is not None:
            ok = authority.verify(token.strip()) is not None  # constant-time MAC comparison
        return None if ok else "invalid bearer token"


def bearer_token(metadata: Any) -> str | None:
    """The token of the one ``authorization: Bearer <token>`` header, or ``None`` without one."""
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    scheme, _, token = values[0].partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def bearer_digest(metadata: Any) -> bytes | None:
    """The digest of the one ``authorization: Bearer <token>`` header, or ``None`` without one."""
    token = bearer_token(metadata)
    return None if token is None else _digest(token)


def _deny(handler: grpc.RpcMethodHandler[Any, Any], problem: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same streaming shape that answers UNAUTHENTICATED without reading the request."""
    status = status_for_error(UnauthenticatedError(problem))

    async def deny(request: bytes, context: Context) -> NoReturn:
        await abort(context, status)

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


# -- rate limits --------------------------------------------------------------------------------

class RateLimitInterceptor(ServerInterceptor):
    """Limit the calls per bearer token (requests/s, the operator token included).

    Placed after :class:`BearerTokenInterceptor`, it wraps the handler, so a call refused for a
    wrong token never reaches the limiter and made-up tokens cannot fill its table (bounded
    anyway). Calls without a bearer token are not limited here (the per-device limit keys them by
    address). Only the collector's own services are limited; health and reflection stay open.

    Parameters
    ----------
    limiter : RateLimiter
    metrics : CollectorMetrics
    """

    def __init__(self, limiter: RateLimiter, metrics: CollectorMetrics) -> None:
        self._limiter = limiter
        self._metrics = metrics
        self._prefixes = (f"/{DEVICE_SERVICE}/", f"/{OPERATOR_SERVICE}/")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefixes):
            return handler
        key = bearer_digest(handler_call_details.invocation_metadata)
        if key is None or handler.request_streaming:
            return handler
        limiter, metrics = self._limiter, self._metrics

        async def check(context: Context) -> None:
            wait = limiter.try_acquire(key)
            metrics.rate_limit_keys.labels(limit=limiter.name).set(len(limiter))
            if wait > 0.0:
                metrics.rate_limited.labels(limit=limiter.name).inc()
                await abort(context, status_for_error(RateLimitedError(
                    f"token rate limit exceeded ({limiter.rate:g} requests/s, burst {limiter.capacity:g}); "
                    f"retry in {wait:.3f} s", limit=limiter.name, retry_after=wait)))

        if handler.response_streaming:
            inner_stream: Any = handler.unary_stream

            async def limited_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                await check(context)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                limited_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        inner: Any = handler.unary_unary

        async def limited(request: Any, context: Context) -> Any:
            await check(context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            limited, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


