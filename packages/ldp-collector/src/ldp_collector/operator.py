"""The operator's client of a running collector: ``ldp.v1.OperatorService`` over gRPC.

:class:`OperatorClient` creates, lists, shows and closes campaigns and reads their estimates and
results with the bearer token of the operator calls. The ``ldp-collector campaign`` and ``plot``
commands use it, and so does the simulation's :class:`~ldp_collector.simulation.runner.RemoteCollector`.

The collector's *server* modules never import ``grpc`` (only the :mod:`ldp_collector.server` package does);
this is a client, so it imports ``grpc`` (through the SDK's transport, :mod:`ldp_client.grpc`, whose
error mapping it shares) when a client is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ldp.v1 import campaigns_pb2, service_pb2
from ldp_client.errors import InvalidParameterError

from .kinds import KINDS as REGISTERED_KINDS
from .serde import kind_number

if TYPE_CHECKING:
    import grpc

    from ldp.v1 import service_pb2_grpc

__all__ = ["KINDS", "CampaignStateError", "OperatorClient", "kind_value"]

#: Campaign kinds by CLI name (``ldp.v1.CampaignKind`` names, lower case), from the kind registry.
KINDS: tuple[str, ...] = tuple(REGISTERED_KINDS)


class CampaignStateError(RuntimeError):
    """The campaign is not in the state an operator's command needs (no open round to close ...)."""


def kind_value(name: str) -> campaigns_pb2.CampaignKind.ValueType:
    """The ``ldp.v1.CampaignKind`` of a lower-case kind name (``"histogram"``).

    Raises
    ------
    InvalidParameterError
        Unknown name; the message lists the known kinds.
    """
    if name not in KINDS:
        raise InvalidParameterError(f"unknown campaign kind {name!r}; known kinds: {', '.join(KINDS)}")
    return kind_number(name)  # type: ignore[return-value]  # a CampaignKind number (the enum's ValueType is an int)



class OperatorClient:
    """A client of the collector's ``ldp.v1.OperatorService`` (bearer-token authenticated).

    Failures raise the SDK's errors, mapped by :func:`ldp_client.grpc.call_error`:
    :class:`~ldp_client.grpc.RequestRejectedError` when the collector rejected the request itself,
    :class:`~ldp_client.grpc.RpcFailedError` otherwise (UNAUTHENTICATED, UNAVAILABLE ...); both are
    :class:`~ldp_client.errors.LdpError` and carry the status code and message.

    Parameters
    ----------
    target : str
        ``host:port`` of the collector.
    token : str, optional
        The operator token (``authorization: Bearer <token>``).
    credentials : grpc.ChannelCredentials, optional
        TLS credentials; ``None`` opens an insecure channel.
    timeout : float
        Deadline of each unary call, in seconds.
    """

    def __init__(self, target: str, *, token: str | None = None, credentials: grpc.ChannelCredentials | None = None,
                 timeout: float = 30.0) -> None:
        import grpc as grpc_module

        from ldp.v1 import service_pb2_grpc as stubs

        if not isinstance(target, str) or not target:
            raise InvalidParameterError(f"target must be a non-empty 'host:port' string, got {target!r}")
        if token is not None and (not token or any(c in token for c in "\r\n ")):
            raise InvalidParameterError("the operator token must be a non-empty single word")
        self._grpc = grpc_module
        self._timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = (grpc_module.insecure_channel(target) if credentials is None
                         else grpc_module.secure_channel(target, credentials))
        self._stub: service_pb2_grpc.OperatorServiceStub = stubs.OperatorServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> OperatorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout, metadata=self._metadata)
        except self._grpc.RpcError as exc:
            from ldp_client.grpc import call_error  # imports grpc, which this module leaves to the call path

            raise call_error(method, exc) from exc

    def create_campaign(self, config: campaigns_pb2.CampaignConfig) -> campaigns_pb2.Campaign:
        """``CreateCampaign``."""
        response: campaigns_pb2.Campaign = self._call(
            "CreateCampaign", service_pb2.CreateCampaignRequest(config=config))
        return response

    def list_campaigns(self, page_size: int = 0) -> list[campaigns_pb2.Campaign]:
        """Every campaign (``ListCampaigns``, all pages)."""
        out: list[campaigns_pb2.Campaign] = []
        token = ""
        while True:
            page: service_pb2.ListCampaignsResponse = self._call(
                "ListCampaigns", service_pb2.ListCampaignsRequest(page_size=page_size, page_token=token))
            out.extend(page.campaigns)
            token = page.next_page_token
            if not token:
                return out

    def get_campaign(self, campaign_id: str) -> campaigns_pb2.Campaign:
        """``GetCampaign``."""
        response: campaigns_pb2.Campaign = self._call(
            "GetCampaign", service_pb2.GetCampaignRequest(campaign_id=campaign_id))
        return response

    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        """``CloseRound``."""
        response: campaigns_pb2.Campaign = self._call(
            "CloseRound", service_pb2.CloseRoundRequest(campaign_id=campaign_id, round=round))
        return response

    def get_estimates(self, campaign_id: str, round: int = 0, confidence: float = 0.0) -> campaigns_pb2.Estimates:
        """``GetEstimates`` (round 0: the latest closed round with estimates)."""
        response: campaigns_pb2.Estimates = self._call(
            "GetEstimates", service_pb2.GetEstimatesRequest(campaign_id=campaign_id, round=round,
                                                            confidence=confidence))
        return response

    def get_result(self, campaign_id: str) -> campaigns_pb2.Result:
        """``GetResult``."""
        response: service_pb2.GetResultResponse = self._call(
            "GetResult", service_pb2.GetResultRequest(campaign_id=campaign_id))
        return response.result

    def watch(self, campaign_id: str, timeout: float | None = None) -> Iterator[service_pb2.CampaignEvent]:
        """``WatchCampaign``: progress events until the campaign finishes or fails (or ``timeout`` s)."""
        stream = self._stub.WatchCampaign(service_pb2.WatchCampaignRequest(campaign_id=campaign_id),
                                          timeout=timeout, metadata=self._metadata)
        try:
            yield from stream
        except self._grpc.RpcError as exc:
            from ldp_client.grpc import call_error

            raise call_error("WatchCampaign", exc) from exc
        finally:
            stream.cancel()  # type: ignore[no-untyped-call, unused-ignore]
