"""The command line's output: JSON, and the human-readable text of campaigns, estimates and clusterings."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import timezone
from typing import Any, TextIO

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from ldp.v1 import campaigns_pb2
from ldp_client.clusters import CellClusterModel
from ldp_client.errors import InvalidParameterError

from .errors import CollectorError
from .model import CampaignState, Clustering, Estimates, Result

__all__ = ["ResultFailedError", "ResultStatus", "clustering_text", "finite", "kind_name", "number_text",
           "print_campaign", "print_estimates", "print_json", "result_status", "state_name", "timestamp_text",
           "to_dict"]


# -- the status of a result ------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ResultStatus:
    """What a result command reports first: its ``status`` and, unless ``ok``, the ``reason``.

    ``status`` is ``ok`` (a result, no warning), ``degraded`` (a result the engine explains with
    warnings: best-effort centers, fewer centers than asked, ...), ``failed`` (nothing published:
    a failed campaign, or a result with neither centers, a cell map, estimates nor heavy hitters)
    or ``pending`` (the campaign has not finished). ``failed`` exits 1; the others exit 0.
    """

    status: str
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


class ResultFailedError(CollectorError):
    """A command's result has the status ``failed``; its output is written, the reason is the message."""


def result_status(result: Result | None, *, error: str = "") -> ResultStatus:
    """The one rule that decides a result's :class:`ResultStatus` (``simulate``, ``campaign show``).

    Parameters
    ----------
    result : Result or None
        The campaign's result (``None``: there is none, e.g. the run stopped with ``error``).
    error : str
        Why the campaign or the run failed (the campaign's ``error``, a simulation error).
    """
    warnings = "; ".join(result.warnings) if result is not None else ""
    if error or result is None or result.state == CampaignState.FAILED:
        return ResultStatus(status="failed", reason=error or warnings or "the campaign failed and gave no reason")
    if result.state != CampaignState.FINISHED:
        return ResultStatus(status="pending",
                            reason=f"the campaign is {CampaignState(result.state).name}, not FINISHED")
    if not _publishes_something(result):
        return ResultStatus(status="failed", reason=warnings or "the result publishes nothing")
    if result.warnings:
        return ResultStatus(status="degraded", reason=warnings)
    return ResultStatus(status="ok")


def _publishes_something(result: Result) -> bool:
    """A clustering result publishes centers or a cell map; any other, its estimates (a heavy-hitter
    search that found no value above its threshold answers with empty estimates) or heavy hitters."""
    clustering = result.clustering
    if clustering is not None:
        return bool(clustering.centers) or (clustering.cell_map is not None and bool(clustering.cell_map.cells))
    return result.estimates is not None or bool(result.heavy_hitters)


def kind_name(kind: int) -> str:
    """Lower-case display name of a ``CampaignKind`` (``"histogram"``), as in ``RoundSpec.kind``."""
    try:
        return campaigns_pb2.CampaignKind.Name(kind).lower()  # type: ignore[arg-type]
    except ValueError:
        return f"kind_{kind}"


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def print_json(obj: Any, stream: TextIO) -> None:
    stream.write(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def finite(value: float) -> float | None:
    """JSON has no NaN: ``None`` instead."""
    return value if math.isfinite(value) else None


def _domain_text(config: campaigns_pb2.CampaignConfig) -> str:
    domain = config.domain
    if domain.WhichOneof("domain") == "categorical_size":
        return f"categorical, {domain.categorical_size} values"
    if domain.WhichOneof("domain") == "numeric":
        ranges = " x ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(domain.numeric.lower, domain.numeric.upper))
        return f"numeric {ranges}"
    return "unset"


def _parameters_text(config: campaigns_pb2.CampaignConfig) -> str:
    which = config.WhichOneof("parameters")
    if which is None:
        return ""
    params = getattr(config, which)
    if which == "histogram":
        parts = [f"oracle {campaigns_pb2.FrequencyOracle.Name(params.oracle)}"]
        if params.cells_per_dimension:
            parts.append(" x ".join(str(c) for c in params.cells_per_dimension) + " cells")
        if params.consistency:
            parts.append("consistent")
        return ", ".join(parts)
    return ", ".join(f"{f.name} {_field_value_text(f, v)}" for f, v in params.ListFields())


def _field_value_text(field: Any, value: Any) -> str:
    """An enum value by name (``TREE``), anything else as is."""
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return str(known.name) if known is not None else str(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def timestamp_text(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return str(ts.ToDatetime(tzinfo=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))


def state_name(state: int) -> str:
    return str(campaigns_pb2.CampaignState.Name(state))  # type: ignore[arg-type]


def print_campaign(campaign: campaigns_pb2.Campaign, stream: TextIO) -> None:
    config = campaign.config
    write = stream.write
    write(f"campaign {config.campaign_id} ({kind_name(config.kind)})  state {state_name(campaign.state)}\n")
    if config.description:
        write(f"  description  {config.description}\n")
    write(f"  epsilon      {config.epsilon:g} per device, budget policy "
          f"{campaigns_pb2.BudgetPolicy.Name(config.budget_policy)}\n")
    write(f"  domain       {_domain_text(config)}\n")
    params = _parameters_text(config)
    if params:
        write(f"  parameters   {params}\n")
    write(f"  created      {timestamp_text(campaign.created_at)}\n")
    for r in campaign.rounds:
        status = "open" if r.open else f"closed {timestamp_text(r.closed_at)}"
        write(f"  round {r.round:<6} {status}, {r.reports:,} reports\n")
    if campaign.error:
        write(f"  error        {campaign.error}\n")


def print_estimates(estimates: Estimates, top: int, stream: TextIO) -> None:
    rows = sorted(estimates.estimates, key=lambda e: -e.count)[:top]
    write = stream.write
    write(f"  estimates of round {estimates.round} from {estimates.reports:,} reports "
          f"(top {len(rows)} of {len(estimates.estimates)}, {estimates.confidence:.0%} intervals"
          f"{', consistent' if estimates.consistent else ''})\n")
    write(f"  {'value':>10} {'count':>12} {'std error':>10} {'interval':>25}\n")
    for e in rows:
        write(f"  {e.value:>10} {e.count:12.1f} {e.std_error:10.1f}   [{e.ci_lower:10.1f}, {e.ci_upper:10.1f}]\n")
    for warning in estimates.warnings:
        write(f"  warning: {warning}\n")


def clustering_text(clustering: Clustering | None) -> str:
    """``3 clusters over 412 cells (120 noise)`` or ``4 centers in 2-D``."""
    clustering = clustering or Clustering()
    if clustering.centers:
        return f"{clustering.k} centers in {clustering.dimension}-D"
    labels = clustering.cell_map.labels if clustering.cell_map is not None else ()
    noise = sum(1 for label in labels if label < 0)
    return f"{clustering.k} clusters over {len(labels):,} cells ({noise:,} noise)"


def cell_map_of(result: Result) -> CellClusterModel:
    """A grid campaign's published cell map (``InvalidParameterError`` when the result has none)."""
    if result.clustering is None or result.clustering.cell_map is None:
        raise InvalidParameterError("the grid clustering has no cells to plot")
    return result.clustering.cell_map


def estimates_of(result: Result) -> Estimates:
    """A histogram campaign's published estimates (``InvalidParameterError`` when the result has none)."""
    if result.estimates is None:
        raise InvalidParameterError("the result holds no estimates")
    return result.estimates


def number_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
