"""The generic RPC handlers of the collector's services: request bytes in, the servicer's
behaviour, errors mapped to ``google.rpc.Status``, metrics per call.

The collector's own services are registered with raw-bytes handlers (no deserializer) so that a
request that does not parse is answered INVALID_ARGUMENT here, never INTERNAL, and so that
``SubmitReports`` can count its reports from the wire before it is parsed in the worker pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.rpc import status_pb2  # type: ignore[import-untyped]

from ldp.v1 import service_pb2

from ..telemetry import CollectorMetrics
from .servicer import CollectorServicer, OperatorServicer
from .status import Context, abort, code_name, status_for_error
from .wire import DEVICE_SERVICE, OPERATOR_SERVICE, parse_request

__all__ = ["add_services"]

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


def _failure(exc: BaseException, method: str, request: type[Message] | None) -> status_pb2.Status:
    """The status a failed call answers (``request``: the request's message type, whose fields the
    error's message may name); unexpected errors are logged with their traceback."""
    if code_name(exc) == "INTERNAL":
        log.error("%s failed", method, exc_info=exc, extra={"method": method})
    return status_for_error(exc, request)


# Aborting a call raises an AbortError that gRPC keeps in a reference cycle with the handler's
# frame until the garbage collector runs. The handlers below therefore abort outside their except
# block (so the error, whose traceback holds the frames that saw the request, is not chained to
# it) and after dropping the request's bytes: a flood of refused requests of megabytes each must
# not stay in memory until a collection.

def _unary_handler(method: str, behavior: Callable[[Any, Context], Awaitable[Resp]], request_type: type[Req] | None,
                   metrics: CollectorMetrics, parsed_as: type[Message] | None = None) -> grpc.RpcMethodHandler[Any, Any]:
    """``behavior`` gets the parsed request, or the request's bytes when ``request_type`` is None
    (it then parses them itself, in the worker pool, as ``parsed_as``)."""
    request = request_type or parsed_as
    async def handle(data: bytes, context: Context) -> Resp:
        start = time.perf_counter()
        code = "OK"
        try:
            try:
                return await behavior(data if request_type is None else parse_request(request_type, data), context)
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                code = code_name(exc)
                status = _failure(exc, method, request)
            del data
            await abort(context, status)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            metrics.observe_rpc(method, code, time.perf_counter() - start)

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None,
                                               response_serializer=_serialize)


def _stream_handler(method: str, behavior: Callable[[Req, Context], AsyncIterator[Resp]], request_type: type[Req],
                    metrics: CollectorMetrics) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(data: bytes, context: Context) -> AsyncIterator[Resp]:
        start = time.perf_counter()
        code = "OK"
        try:
            try:
                async for item in behavior(parse_request(request_type, data), context):
                    yield item
                return
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                code = code_name(exc)
                status = _failure(exc, method, request_type)
            del data
            await abort(context, status)
        except (asyncio.CancelledError, GeneratorExit):
            code = "CANCELLED"
            raise
        finally:
            metrics.observe_rpc(method, code, time.perf_counter() - start)

    return grpc.unary_stream_rpc_method_handler(handle, request_deserializer=None,
                                                response_serializer=_serialize)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_services(server: grpc.aio.Server, device: CollectorServicer, operator: OperatorServicer,
                  metrics: CollectorMetrics) -> None:
    def unary(service: str, name: str, behavior: Callable[[Any, Context], Awaitable[Any]],
              request_type: type[Message] | None,
              parsed_as: type[Message] | None = None) -> tuple[str, grpc.RpcMethodHandler[Any, Any]]:
        return name, _unary_handler(f"{service.rsplit('.', 1)[-1]}/{name}", behavior, request_type, metrics,
                                    parsed_as)

    device_handlers = dict([
        unary(DEVICE_SERVICE, "Enroll", device.Enroll, service_pb2.EnrollRequest),
        unary(DEVICE_SERVICE, "GetRoundSpec", device.GetRoundSpec, service_pb2.GetRoundSpecRequest),
        unary(DEVICE_SERVICE, "SubmitReports", device.SubmitReports, None,  # parsed in the worker pool
              service_pb2.SubmitReportsRequest),
        unary(DEVICE_SERVICE, "SubmitPacked", device.SubmitPacked, service_pb2.SubmitPackedRequest),
        unary(DEVICE_SERVICE, "GetResult", device.GetResult, service_pb2.GetResultRequest),
    ])
    operator_handlers = dict([
        unary(OPERATOR_SERVICE, "CreateCampaign", operator.CreateCampaign, service_pb2.CreateCampaignRequest),
        unary(OPERATOR_SERVICE, "ListCampaigns", operator.ListCampaigns, service_pb2.ListCampaignsRequest),
        unary(OPERATOR_SERVICE, "GetCampaign", operator.GetCampaign, service_pb2.GetCampaignRequest),
        unary(OPERATOR_SERVICE, "CloseRound", operator.CloseRound, service_pb2.CloseRoundRequest),
        unary(OPERATOR_SERVICE, "GetEstimates", operator.GetEstimates, service_pb2.GetEstimatesRequest),
        unary(OPERATOR_SERVICE, "GetResult", operator.GetResult, service_pb2.GetResultRequest),
    ])
    operator_handlers["WatchCampaign"] = _stream_handler(
        "OperatorService/WatchCampaign", operator.WatchCampaign, service_pb2.WatchCampaignRequest, metrics)
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(DEVICE_SERVICE, device_handlers),
        grpc.method_handlers_generic_handler(OPERATOR_SERVICE, operator_handlers),
    ))

