"""The hypothesis profile every test run uses: no wall-clock limits, the default example counts.

Hypothesis's defaults fail a property test whose example takes over 200 ms (``deadline``) and a
test whose data generation is slow (``HealthCheck.too_slow``). Both measure the machine, not the
code: on a busy CI runner they turn a correct test red. The project's rule is that timing targets
are measured by benchmarks, so the profile turns both off and keeps everything else, including
``max_examples`` (a test's own ``@settings(max_examples=...)`` still applies).

The smoke environment does not install hypothesis (its tests do not use it); there the profile
is simply not registered.
"""

from __future__ import annotations

__all__ = ["PROFILE", "assert_profile_active", "load_profile"]

#: The name of the profile (``--hypothesis-profile`` may still pick another one explicitly).
PROFILE = "ldp-ci"


def load_profile() -> None:
    """Register :data:`PROFILE` and make it the default, when hypothesis is installed."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the smoke environment: no property tests, nothing to configure
        return

    settings.register_profile(PROFILE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(PROFILE)


def assert_profile_active() -> None:
    """Fail unless :data:`PROFILE` is what this test run's ``@settings``/``@given`` inherit."""
    from hypothesis import HealthCheck, settings

    active = settings.default
    assert active.deadline is None, f"hypothesis deadline {active.deadline}: the {PROFILE} profile is not loaded"
    assert HealthCheck.too_slow in active.suppress_health_check
    assert active.max_examples == settings.get_profile("default").max_examples  # counts are kept
    assert settings(max_examples=3).deadline is None  # what a test's own @settings inherits
