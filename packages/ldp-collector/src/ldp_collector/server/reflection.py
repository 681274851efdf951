"""gRPC server reflection, both versions: ``grpc.reflection.v1`` and the older ``v1alpha``.

``grpcio-reflection`` (up to 1.85 at least) implements only ``grpc.reflection.v1alpha``, while
current tools (grpcurl, Postman, grpcui) ask for ``grpc.reflection.v1`` first and some only speak v1.
The two versions are the same protocol under two package names: their messages have the same
fields, numbers and types (``proto/third_party/grpc/reflection``), so one servicer answers both, as
grpc-java's does. Its v1alpha message classes parse and serialize the v1 wire bytes unchanged.

For the v1 service to be described like every other listed service, the descriptor of
``grpc/reflection/v1/reflection.proto`` is added to the default descriptor pool, derived from the
v1alpha one by renaming its package (unless the pool has it already).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

__all__ = ["REFLECTION_SERVICES", "V1_SERVICE_NAME", "enable_reflection"]

#: The v1 reflection service's full name.
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
#: Both reflection services, as the reflection service lists them.
REFLECTION_SERVICES: tuple[str, str] = (V1_SERVICE_NAME, reflection.SERVICE_NAME)

_V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
_V1_PACKAGE = "grpc.reflection.v1"


def _add_v1_descriptor() -> None:
    """Put the v1 reflection file into the default pool (the v1alpha file, package renamed)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name, file.package = _V1_FILE, _V1_PACKAGE
    file.ClearField("options")  # v1alpha's (deprecated, Java/Go packages) are not v1's
    old, new = f".{_V1ALPHA_PACKAGE}.", f".{_V1_PACKAGE}."
    for message in file.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old):]
    for service in file.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old):]
            method.output_type = new + method.output_type[len(old):]
    pool.Add(file)


def enable_reflection(server: grpc.aio.Server, service_names: tuple[str, ...]) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names`` and both
    reflection services."""
    _add_v1_descriptor()
    servicer: Any = reflection.aio.ReflectionServicer(  # type: ignore[attr-defined]  # re-exported at run time
        (*service_names, *REFLECTION_SERVICES))
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers(tuple(
        grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
        for name in REFLECTION_SERVICES))
