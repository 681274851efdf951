"""The collector's gRPC front end: a thin layer over :class:`~ldp_collector.core.Collector`.

This package is the only part of the collector's server that imports ``grpc``. One module per
responsibility:

:mod:`~ldp_collector.server.servicer`
    ``DeviceService`` and ``OperatorService``: request -> plain handler -> response.
:mod:`~ldp_collector.server.handlers`
    The generic handlers: request bytes in, errors mapped to status codes, metrics per call.
:mod:`~ldp_collector.server.status`
    Domain errors -> ``google.rpc.Status`` with its details (:func:`status_for_error`).
:mod:`~ldp_collector.server.wire`
    Hand-written wire helpers: request parsing, counting reports before parsing, outcome encoding.
:mod:`~ldp_collector.server.worker_pool`
    The bounded, load-shedding pool the blocking jobs run in.
:mod:`~ldp_collector.server.interceptors`
    Bearer-token authentication, the per-token rate limit, undecodable standard-service requests.
:mod:`~ldp_collector.server.lifecycle`
    TLS, binding, health, reflection, the round timer, graceful start and stop
    (:func:`serve`, :func:`start_server`).
:mod:`~ldp_collector.server.supervisor`
    ``serve --workers N``: several server processes on one port. It imports no ``grpc`` itself:
    the workers it forks do.

Every RPC is *decode -> plain handler -> encode*: the request bytes are parsed here (a parse
failure is INVALID_ARGUMENT, never INTERNAL), request-level limits are checked (``request_id``,
batch size), and one blocking job runs in a bounded worker pool so the event loop stays free for
other calls. The transport refuses a request beyond ``max_receive_bytes`` (by default the largest
legal batch). Domain errors map to status codes with ``google.rpc.Status`` details.

Security model
--------------
``OperatorService`` needs ``authorization: Bearer <operator_token>``. Without a configured token
the server only starts on a loopback address (anyone on this host may then act as operator), or
anywhere with ``allow_insecure_operator`` set -- :class:`~ldp_collector.config.CollectorConfig`
enforces this. ``DeviceService`` needs ``Bearer <device token>`` (the operator token also works)
only when ``device_tokens`` is configured. With ``enrolment`` on, ``DeviceService.Enroll`` is open
(rate limited globally and per peer address: UNAVAILABLE + RetryInfo beyond the limits) and hands
out device tokens that every process sharing ``enrolment_secret`` verifies without state; every
other ``DeviceService`` call then needs an enrolled token (or a static device token, or the
operator token), and an enrolled device gets its report id and hash seeds assigned with each round
spec and must report with exactly those (:mod:`ldp_collector.defences`). Health and reflection are
always open. Tokens are compared in constant time (hashes of equal length via
:func:`hmac.compare_digest`); with TLS off, tokens cross the network in clear text, so use TLS
beyond loopback.

Import from the modules (``from ldp_collector.server.lifecycle import start_server``): this file
imports nothing, so that importing the supervisor keeps the parent process free of ``grpc``
(gRPC's threads and sockets do not survive a fork; the forked workers create their own).
"""
