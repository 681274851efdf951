"""This environment's hypothesis tests run without wall-clock deadlines (``tests/conftest.py``)."""

import pytest

pytest.importorskip("hypothesis")

from support.hypothesis_profile import assert_profile_active


def test_the_hypothesis_profile_has_no_wall_clock_limits() -> None:
    assert_profile_active()
