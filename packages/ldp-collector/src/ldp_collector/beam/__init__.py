"""The round steps on Apache Beam: a round's accumulators as ``CombineFn``\\ s over its Parquet files.

Needs Apache Beam and pyarrow beside the collector (README, "Beyond one database"). Beam's own
metadata asks for protobuf < 7 while ``ldp.v1`` needs protobuf 7; Beam runs on protobuf 7, so it is
installed first and the collector after it (pip then reports the pin, and keeps protobuf 7).
"""

from __future__ import annotations

try:
    import apache_beam  # noqa: F401  # fail here, with the way out, rather than deep in a pipeline
except ImportError as exc:
    raise ImportError("the Beam step needs Apache Beam: pip install 'apache-beam==2.77.0' and then "
                      "'ldp-collector[export]' (README, \"Beyond one database\")") from exc

from .combine import ReportCombineFn
from .step import (
    DEFAULT_RUNNER,
    BeamRoundReports,
    accumulate_rounds,
    beam_round_reports,
    close_round_on_beam,
    combine_rounds,
    pipeline_args,
)

__all__ = ["DEFAULT_RUNNER", "BeamRoundReports", "ReportCombineFn", "accumulate_rounds", "beam_round_reports",
           "close_round_on_beam", "combine_rounds", "pipeline_args"]
