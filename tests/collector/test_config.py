"""``ldp_collector.config``: the ``LDP_*`` namespace, unknown names with the nearest known one,
files that are not UTF-8.

(The configuration's values, precedence and token files are tested in ``test_service.py``.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ldp_collector.config import (
    NON_CONFIG_VARIABLES,
    TEST_VARIABLE_PREFIX,
    ConfigError,
    config_variables,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]
TOKEN = "config-operator-token-0123456789"


@pytest.mark.parametrize(("env", "message"), [
    ({"LDP_OPERATOR_TOKN": TOKEN},
     "unknown environment variable LDP_OPERATOR_TOKN (did you mean LDP_OPERATOR_TOKEN?)"),
    ({"LDP_data_dir": "/srv/ldp"}, "unknown environment variable LDP_data_dir (did you mean LDP_DATA_DIR?)"),
    ({"LDP_LISTN": "127.0.0.1:1", "LDP_WORKER": "2"},
     "unknown environment variables LDP_LISTN (did you mean LDP_LISTEN?), LDP_WORKER (did you mean LDP_WORKERS?)"),
    ({"LDP_COLLECTR": "127.0.0.1:1"}, "LDP_COLLECTR (did you mean LDP_COLLECTOR?)"),
    # Nothing near: no suggestion (the shared LDP_ prefix alone does not make a name look alike).
    ({"LDP_ZZZ": "1"}, "unknown environment variable LDP_ZZZ; LDP_* variables set the configuration keys"),
])
def test_an_unknown_ldp_variable_is_an_error_naming_the_nearest_known_one(env: dict[str, str],
                                                                          message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_the_test_namespace_and_the_operator_commands_variable_are_not_configuration(tmp_path: Path) -> None:
    env = {"LDP_TEST_POSTGRES_URL": "postgresql://nowhere/db", "LDP_TEST_FUZZ_EXAMPLES": "5",
           "LDP_TEST_FAULT_KILLS": "3", "LDP_TEST_SOMETHING_NEW": "x", "LDP_COLLECTOR": "127.0.0.1:1",
           "LDP_DATA_DIR": str(tmp_path), "OTHER_VARIABLE": "ignored"}
    assert load_config(None, env=env).data_dir == str(tmp_path)
    # No configuration key can ever be shadowed by the reserved namespace.
    assert not [name for name in config_variables() if name.startswith(TEST_VARIABLE_PREFIX)]
    assert not NON_CONFIG_VARIABLES & config_variables()


def test_an_unknown_file_key_names_the_nearest_known_one(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('lisen = "127.0.0.1:1"\nmax_bach_reports = 3\n')
    with pytest.raises(ConfigError, match=r"unknown configuration keys lisen \(did you mean listen\?\), "
                                          r"max_bach_reports \(did you mean max_batch_reports\?\)"):
        load_config(path, env={})


def test_files_that_are_not_utf8_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('description = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml' is not UTF-8 text \(TOML is UTF-8\): invalid "
                                          r"continuation byte at byte 18"):
        load_config(path, env={})
    tokens = tmp_path / "tokens"
    tokens.write_bytes(b"\xff\xfe" + TOKEN.encode("utf-16-le"))
    with pytest.raises(ConfigError, match="device_tokens_file: .* is not UTF-8 text"):
        load_config(None, env={"LDP_DEVICE_TOKENS_FILE": str(tokens)})


# -- the LDP_ namespace across the repository ------------------------------------------------------

_NAME = re.compile(r"\bLDP_[A-Z0-9_]*[A-Z0-9]\b")
_SCANNED_SUFFIXES = {".py", ".md", ".ini", ".toml", ".cfg", ".txt", ".sh", ".yml", ".yaml"}
_SKIPPED_DIRS = {".git", ".tox", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", "results"}
#: The docs' example of a typo the collector catches (this file's own typos are not scanned).
_MISTYPED_ON_PURPOSE = {"LDP_OPERATOR_TOKN"}


def _repository_files() -> list[Path]:
    files = [REPO / ".ci" / "run"]
    this = Path(__file__).resolve()
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS and not d.endswith(".egg-info")]  # pruned, not walked
        for name in names:
            path = Path(root) / name
            if path.suffix in _SCANNED_SUFFIXES and "_pb2" not in name and path != this:
                files.append(path)
    return [f for f in files if f.is_file()]


def test_every_ldp_name_in_the_repository_is_configuration_or_in_the_test_namespace() -> None:
    """A new test or benchmark knob named ``LDP_SOMETHING`` would make ``ldp-collector serve``
    refuse to start in the environment that sets it: knobs go under ``LDP_TEST_``."""
    enum_values = set()
    for proto in (REPO / "proto").rglob("*.proto"):
        enum_values |= set(re.findall(r"^\s*(LDP_\w+)\s*=\s*\d+\s*;", proto.read_text(), re.MULTILINE))
    allowed = config_variables() | NON_CONFIG_VARIABLES | enum_values | _MISTYPED_ON_PURPOSE
    stray: dict[str, set[str]] = {}
    files = _repository_files()
    for path in files:
        for name in _NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            if name not in allowed and not name.startswith(TEST_VARIABLE_PREFIX):
                stray.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert len(files) > 50  # the scan saw the repository
    assert not stray, (f"LDP_* names that are neither configuration variables nor under {TEST_VARIABLE_PREFIX} "
                       f"(rename test and benchmark knobs to {TEST_VARIABLE_PREFIX}...): {stray}")
