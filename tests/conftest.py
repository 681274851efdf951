"""Shared fixtures: make ``tests/support`` importable as ``support``; the hypothesis profile.

Every tox environment runs pytest under ``tests/``, so this file is loaded before any test
module and its profile is the default of every ``@settings``/``@given`` (a test's own
``@settings`` inherits what it does not set).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from support.hypothesis_profile import load_profile

load_profile()
