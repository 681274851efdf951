"""Server-side estimation: frequency oracles, accumulators, heavy hitters (numpy, vectorized).

* :mod:`.frequency` -- one aggregator per oracle (``zero`` / ``add`` / ``merge`` / ``estimate``),
  unbiased counts with analytic standard errors and intervals, consistency post-processing;
* :mod:`.olh_hash` -- the local-hashing hash over numpy arrays, bit-identical to the SDK's;
* :mod:`.accumulators` -- per-round mergeable accumulator blobs for the store;
* :mod:`.heavy_hitters` -- prefix-tree heavy hitters over huge domains;
* :mod:`.kmeans` -- weighted k-means++ and Lloyd on coresets (signed weights allowed).

Simulated reports for tests and benchmarks live in :mod:`ldp_collector.simulation.reports`.

Every constant (p, q, g, variances) comes from the SDK's parameter objects.
"""

from __future__ import annotations

from .accumulators import (
    CountAccumulator,
    accumulator_key,
    aggregate_reports,
    component_params_from_spec,
    decode_report_payloads,
    make_accumulate_fn,
    rebuild,
)
from .frequency import (
    ConsistencyMethod,
    FrequencyAggregator,
    FrequencyEstimate,
    FrequencyOracleParams,
    GRRAggregator,
    LocalHashingAggregator,
    UnaryEncodingAggregator,
    estimate_from_support,
    make_aggregator,
    make_consistent,
)
from .heavy_hitters import (
    HeavyHitterConfig,
    LevelOutcome,
    bonferroni_z,
    first_candidates,
    level_candidates,
    level_params,
    next_candidates,
    prefixes,
)
from .olh_hash import hash_values, support_counts

__all__ = [
    "ConsistencyMethod",
    "CountAccumulator",
    "FrequencyAggregator",
    "FrequencyEstimate",
    "FrequencyOracleParams",
    "GRRAggregator",
    "HeavyHitterConfig",
    "LevelOutcome",
    "LocalHashingAggregator",
    "UnaryEncodingAggregator",
    "accumulator_key",
    "aggregate_reports",
    "bonferroni_z",
    "component_params_from_spec",
    "decode_report_payloads",
    "estimate_from_support",
    "first_candidates",
    "hash_values",
    "level_candidates",
    "level_params",
    "make_accumulate_fn",
    "make_aggregator",
    "make_consistent",
    "next_candidates",
    "prefixes",
    "rebuild",
    "support_counts",
]
