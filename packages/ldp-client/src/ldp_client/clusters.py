"""Local cluster labels from a published clustering result: no report, no privacy cost.

A finished clustering campaign publishes its result (``ldp.v1.Result.clustering``): either a cell
map -- a partition of the domain box into dyadic cells with one cluster label per cell
(``ldp.v1.CellClusterMap``, ``-1`` = noise) -- or ``k`` centers. Both are public, so a device can
label its own point with them on the device: the point is never sent, nothing is reported and no
privacy budget is charged. :class:`CellClusterModel` and :class:`CenterModel` hold the two forms;
:func:`ldp_client.serde.cluster_model_from_proto` builds one from a ``Result`` and
:meth:`ldp_client.grpc.CollectorClient.cluster_label` fetches and applies it in one call::

    model = client.get_cluster_model("traffic-2026")   # public data only
    label = model.label((latitude, longitude))          # -1 = noise (cell maps only)

Both models have a plain-data form (:meth:`~CellClusterModel.to_dict`, msgpack-friendly) to keep
them on the device between sessions; :func:`cluster_model_from_dict` reads either form back.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeAlias

from ._spec import Spec
from ._validation import check_int
from .encoders.base import MAX_DIMENSION, NumericDomain, as_point
from .encoders.geometry import TreeCell, _float_field, _require_domain, _tuple_field
from .encoders.grid import CellListEncoder
from .encoders.nearest import nearest_index
from .errors import InvalidParameterError, ProtocolError

__all__ = [
    "MAX_CENTER_VALUES",
    "NOISE",
    "CellClusterModel",
    "CenterModel",
    "ClusterModel",
    "cluster_model_from_dict",
]

#: The label of a cell that belongs to no cluster.
NOISE = -1
#: Largest cluster label (labels travel as ``sint32``).
_MAX_LABEL = 2**31 - 1
#: Largest number of center coordinates (``k * d``) in a :class:`CenterModel`.
MAX_CENTER_VALUES = 2**22


@dataclass(frozen=True, kw_only=True)
class CellClusterModel(Spec):
    """A grid clustering: the cluster label of every cell of a partition (``ldp.v1.CellClusterMap``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds of the clustered points; points outside are clamped.
    cells : tuple of TreeCell
        Dyadic cells (levels may differ) that partition the normalized box exactly, as for a
        :class:`~ldp_client.encoders.CellListEncoder` (at most 2^20 cells).
    labels : tuple of int
        ``labels[i]`` is the cluster of ``cells[i]``: ``0`` to ``2^31 - 1``, or ``-1`` (noise).
    densities, density_std_errors : tuple of float
        Optional published density estimate of each cell and its standard error: empty, or one
        finite value per cell (standard errors ``>= 0``). Not used for labelling.

    Raises
    ------
    InvalidParameterError
        The cells do not partition the box (the message names the overlap or the gap), or a
        length, label, density or standard error is out of range.
    TypeError
        A field has the wrong type.

    Notes
    -----
    :meth:`label` locates the point exactly as :class:`~ldp_client.encoders.CellListEncoder` does
    (same clamping, same half-open cells, same faces), in ``O(d + L)`` for ``L`` distinct levels.
    """

    domain: NumericDomain
    cells: tuple[TreeCell, ...]
    labels: tuple[int, ...]
    densities: tuple[float, ...] = ()
    density_std_errors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        for name in ("cells", "labels", "densities", "density_std_errors"):
            object.__setattr__(self, name, _tuple_field(name, getattr(self, name)))
        _ = self.encoder  # validates the cells (types, count, partition) once and keeps the lookup tables
        n = len(self.cells)
        if len(self.labels) != n:
            raise InvalidParameterError(f"labels must hold one label per cell ({n}), got {len(self.labels)}")
        for i, label in enumerate(self.labels):
            check_int(f"labels[{i}]", label, NOISE, _MAX_LABEL)
        for name in ("densities", "density_std_errors"):
            values = _float_field(name, getattr(self, name))
            if values and len(values) != n:
                raise InvalidParameterError(
                    f"{name} must be empty or hold one value per cell ({n}), got {len(values)}")
            object.__setattr__(self, name, values)
        for i, se in enumerate(self.density_std_errors):
            if se < 0.0:
                raise InvalidParameterError(f"density_std_errors[{i}] must be >= 0, got {se}")

    @cached_property
    def encoder(self) -> CellListEncoder:
        """The :class:`~ldp_client.encoders.CellListEncoder` of :attr:`cells` (built once)."""
        return CellListEncoder(domain=self.domain, cells=self.cells)

    @cached_property
    def cluster_count(self) -> int:
        """Number of distinct clusters (labels ``>= 0``)."""
        return len({label for label in self.labels if label >= 0})

    def cell_position(self, point: Any) -> int:
        """Position in :attr:`cells` of the cell holding the clamped point (the encoder's index).

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return self.encoder.encode(point)

    def label(self, point: Any) -> int:
        """Cluster label of the cell holding the clamped point (``-1``: the cell is noise).

        Purely local: the point is not sent anywhere and no privacy budget is spent.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return self.labels[self.encoder.encode(point)]


@dataclass(frozen=True, kw_only=True)
class CenterModel:
    """A center-based clustering: ``k`` centers, a point belongs to the nearest one.

    Parameters
    ----------
    centers : tuple of tuple of float
        ``k >= 1`` rows of ``d`` finite coordinates (``1 <= d <= 4096``, ``k d <= 2^22``), in the
        units of the points (``ldp.v1.Clustering.centers`` is the same matrix flattened row-major).

    Raises
    ------
    InvalidParameterError
        No center, rows of different lengths, or a non-finite coordinate.
    TypeError
        ``centers`` is not a sequence of sequences of real numbers.

    Notes
    -----
    There is no domain and no clamping: the point is compared with the centers as given. Cost:
    ``k`` calls of :func:`math.dist` (C), then exact arithmetic only among near-ties
    (:func:`~ldp_client.encoders.nearest.nearest_index`).
    """

    centers: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        rows = _tuple_field("centers", self.centers)
        if not rows:
            raise InvalidParameterError("centers must hold at least one center, got none")
        d = len(_tuple_field("centers[0]", rows[0]))
        if not 1 <= d <= MAX_DIMENSION:
            raise InvalidParameterError(f"centers must have dimension in [1, {MAX_DIMENSION}], got {d}")
        if len(rows) * d > MAX_CENTER_VALUES:
            raise InvalidParameterError(
                f"centers must hold at most {MAX_CENTER_VALUES} coordinates, got {len(rows)} x {d}")
        out = []
        for i, row in enumerate(rows):
            values = _float_field(f"centers[{i}]", _tuple_field(f"centers[{i}]", row))
            if len(values) != d:
                raise InvalidParameterError(f"every center must have dimension {d} (centers[0]), "
                                            f"got {len(values)} in centers[{i}]")
            out.append(values)
        object.__setattr__(self, "centers", tuple(out))

    @property
    def dimension(self) -> int:
        """``d``, the dimension of the points and centers."""
        return len(self.centers[0])

    @property
    def cluster_count(self) -> int:
        """Number of clusters ``k`` (one per center)."""
        return len(self.centers)

    def label(self, point: Any) -> int:
        """Index of the center nearest to the point; the lowest index on exact ties.

        The rule of the nearest-candidate encoder (``docs/protocol.md`` §11.7, §15.3): exact
        squared Euclidean distances, so two centers whose rounded distances tie are still told
        apart, but without clamping (a published center result carries no domain). Purely local: the point is not sent anywhere and no privacy budget is spent.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return nearest_index(as_point(point, self.dimension), self.centers)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form ``{"centers": [[...], ...]}`` (lists of floats; msgpack-friendly)."""
        return {"centers": [list(row) for row in self.centers]}

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "") -> CenterModel:
        """Build and validate from :meth:`to_dict` output; any problem is a :class:`ProtocolError`."""
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ProtocolError(f"{where}: expected a mapping, got {type(data).__name__}")
        unknown = set(data) - {"centers"}
        if unknown:
            raise ProtocolError(f"{where}: unknown field(s) {sorted(map(str, unknown))}")
        if "centers" not in data:
            raise ProtocolError(f"{where}: missing field 'centers'")
        try:
            return cls(centers=data["centers"])
        except (TypeError, InvalidParameterError) as exc:
            raise ProtocolError(f"{where}: {exc}") from exc


#: Either kind of published clustering a device can label itself with.
ClusterModel: TypeAlias = CellClusterModel | CenterModel


def cluster_model_from_dict(data: Any, *, where: str = "") -> ClusterModel:
    """Read back the :meth:`~CellClusterModel.to_dict` form of either model.

    A mapping with ``centers`` is a :class:`CenterModel`, one with ``cells`` a
    :class:`CellClusterModel`.

    Raises
    ------
    ProtocolError
        Not a mapping, neither form, or the model does not validate.
    """
    where = where or "cluster_model"
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}: expected a mapping, got {type(data).__name__}")
    if "centers" in data:
        return CenterModel.from_dict(data, where=where)
    if "cells" in data:
        return CellClusterModel.from_dict(data, where=where)
    raise ProtocolError(f"{where}: expected a mapping with 'centers' (CenterModel) or 'cells' (CellClusterModel), "
                        f"got keys {sorted(map(str, data))}")
