"""Simulations and their evaluation: everything the collector's tests, CLI and benchmarks need beside it.

Nothing in the service's production path (:mod:`ldp_collector.core`, the campaign engines, the
estimators, storage, the :mod:`ldp_collector.server` package) imports this package; it imports them.

:mod:`.population`
    ``n`` simulated devices that decide and randomize with the real device SDK.
:mod:`.runner`
    :func:`~.runner.run_campaign`: a population plays a whole campaign on an in-process
    collector or on a running one over gRPC.
:mod:`.datasets`
    Generated and bundled datasets (nothing downloaded).
:mod:`.evaluation`
    A campaign's result scored against the simulation's truth.
:mod:`.scores`
    The one implementation of the clustering scores and of the non-private reference k-means.
:mod:`.reports`
    Reports drawn with numpy from an oracle's output distribution, for the estimators' tests and
    benchmarks (float probabilities: never on devices).

Simulation randomness is seeded and therefore not privacy-preserving.
"""
