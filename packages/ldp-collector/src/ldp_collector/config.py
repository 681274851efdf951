"""Collector configuration: a TOML file with ``LDP_*`` environment overrides.

Precedence, lowest first: the dataclass defaults, the TOML file, the environment, explicit
``overrides`` (the CLI's flags). The file is flat (``listen = "0.0.0.0:50051"``); a
``[collector]`` table is accepted too. Every bad value raises :class:`ConfigError` naming the key
and where it came from, e.g. ``"LDP_METRICS_PORT: metrics_port must be an integer in [0, 65535],
got 'abc'"``.

Environment variables are ``LDP_`` plus the upper-cased key (``LDP_LISTEN``, ``LDP_DATA_DIR``,
``LDP_OPERATOR_TOKEN``, ``LDP_METRICS_PORT`` ...). Lists (``device_tokens``) are comma-separated
there, booleans are ``1/0``, ``true/false``, ``yes/no`` or ``on/off``.

The configuration owns the ``LDP_`` prefix: any other ``LDP_*`` variable is an error, like an
unknown key in the file, so a mistyped ``LDP_OPERATOR_TOKN`` cannot leave the server running
without the token it was meant to have. Two exceptions, so that the environment of an operator or
a CI run does not stop ``serve``: ``LDP_COLLECTOR`` (the address the ``campaign`` commands call)
and the ``LDP_TEST_*`` namespace, reserved for the test suite's and the benchmarks' knobs
(``LDP_TEST_POSTGRES_URL``, ``LDP_TEST_FUZZ_EXAMPLES`` ...); no configuration key starts with
``test_``.

Secrets: ``operator_token`` and ``device_tokens`` may instead be read from files
(``operator_token_file``, ``device_tokens_file``: one token per line), which keeps them out of
the TOML file and the process environment.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib  # the collector requires Python 3.11+

from ldp_client.report import MAX_BATCH_BYTES, MAX_BATCH_REPORTS

from .ratelimit import DEFAULT_MAX_KEYS

__all__ = ["DEFAULT_CONFIG_FILE", "NON_CONFIG_VARIABLES", "TEST_VARIABLE_PREFIX", "CollectorConfig", "ConfigError",
           "config_variables", "is_loopback", "load_config", "split_listen"]

#: Read by :func:`load_config` when no path is given and the file exists.
DEFAULT_CONFIG_FILE = "ldp-collector.toml"
_ENV_PREFIX = "LDP_"
#: ``LDP_*`` variables that are not ``serve``'s configuration: the ``campaign``/``plot`` commands'
#: collector address.
NON_CONFIG_VARIABLES = frozenset({"LDP_COLLECTOR"})
#: Reserved for the test suite and the benchmarks; never configuration, ignored by :func:`load_config`.
TEST_VARIABLE_PREFIX = "LDP_TEST_"
#: Keys the file and the environment may set beyond the dataclass fields.
_FILE_ONLY_KEYS = ("operator_token_file", "device_tokens_file")
_LOG_FORMATS = ("auto", "json", "text")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_MAX_TOKEN = 4096
_MIN_TOKEN = 16


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


@dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    """Everything ``ldp-collector serve`` needs; validated on construction.

    Parameters
    ----------
    listen : str
        ``host:port`` to bind (``[::1]:50051`` for IPv6); port 0 picks a free port.
    data_dir : str
        The store: a directory for the embedded SQLite store (created if missing; ``sqlite:///DIR``
        too), or a ``postgresql://`` URL of a database several collector processes and hosts
        share (``pip install 'ldp-collector[postgres]'``).
    operator_token : str
        Bearer token for ``OperatorService`` (at least 16 characters). Empty: operator calls are
        unauthenticated, which the server allows only on a loopback address or with
        ``allow_insecure_operator``.
    device_tokens : tuple of str
        When non-empty, ``DeviceService`` calls need ``authorization: Bearer <one of them>``.
    enrolment : bool
        Devices enrol with ``DeviceService.Enroll`` (rate limited) and every other
        ``DeviceService`` call needs an enrolled device token (or one of ``device_tokens``, or the
        operator token). Enrolled devices get their report ids and hash seeds assigned
        (:mod:`ldp_collector.defences`). Needs ``enrolment_secret``.
    enrolment_secret : str
        Key of the device tokens and assignments, at least 16 characters (``LDP_ENROLMENT_SECRET``);
        every collector process and host sharing the campaigns must use the same one.
    enrolment_rate, enrolment_burst : float, int
        Enrolments per second over all peers, and the largest burst.
    enrolment_peer_rate, enrolment_peer_burst : float, int
        Enrolments per second from one peer address, and its largest burst.
    allow_insecure_operator : bool
        Start without an operator token on a non-loopback address (operator calls open to anyone
        who can reach the port). Off by default.
    tls_cert, tls_key : str
        PEM server certificate chain and private key; both or neither.
    tls_client_ca : str
        PEM CA bundle; when set, clients must present a certificate it signed (mTLS). Needs TLS.
    max_receive_bytes : int
        Largest request message the server accepts (gRPC ``max_receive_message_length``); a larger
        one is refused by the transport before anything reads it. Default
        :data:`ldp_client.report.MAX_BATCH_BYTES` (1 820 515 bytes): the largest legal batch,
        ``max_batch_reports`` copies of the largest one-scalar report in its larger encoding plus the
        longest request id (the formula is in :mod:`ldp_client.report`).
    max_send_bytes : int
        Largest response message.
    max_batch_reports : int
        Largest number of reports in one ``SubmitReports``/``SubmitPacked`` request, at most
        :data:`ldp_client.report.MAX_BATCH_REPORTS` (10 000, the default).
    max_concurrent_rpcs : int
        RPCs served at once before gRPC answers RESOURCE_EXHAUSTED (0 = no limit).
    max_queued_calls : int
        Handler calls waiting for or running in the worker pool before the service sheds load
        with UNAVAILABLE + RetryInfo (0 = no limit).
    max_queued_bytes : int
        Request bytes of the report batches waiting for or running in the worker pool before the
        service sheds load the same way (0 = no limit; one batch is always admitted). Bounds the
        memory queued batches hold whatever their size, where ``max_queued_calls`` alone would
        allow ``max_queued_calls * max_receive_bytes``.
    worker_threads : int
        Threads running the blocking collector handlers (group commit waits on the disk).
    keepalive_time_s, keepalive_timeout_s : float
        Server keepalive ping interval and the time to wait for its acknowledgement.
    grace_period_s : float
        How long a graceful shutdown lets in-flight RPCs finish.
    tick_interval_s : float
        Period of the background task that closes rounds on report count or deadline and resumes
        server steps whose process died (it also runs once at start-up, before the first period).
    watch_poll_interval_s : float
        How often ``WatchCampaign`` looks for changes.
    reuse_port : bool
        Set SO_REUSEPORT so several collector processes can share the port (DESIGN §9).
    workers : int
        Server processes ``ldp-collector serve`` runs on this host, in [1, 64]. Above 1 the parent
        forks that many workers sharing the port with SO_REUSEPORT (``reuse_port`` is implied) and
        supervises them; only worker 0 closes rounds on the timer.
    device_rate_limit : float
        Reports per second one device may submit (0 = no limit). A device is its bearer token when
        device tokens are required, else the peer's IP address. Beyond it the service answers
        RESOURCE_EXHAUSTED with RetryInfo (the time until the device's bucket refills).
    device_rate_burst : int
        Reports a device may submit at once before ``device_rate_limit`` applies (0 = one second's
        worth, at least ``max_batch_reports``).
    token_rate_limit : float
        Requests per second per bearer token, the operator token included (0 = no limit).
    token_rate_burst : int
        Requests per token at once before ``token_rate_limit`` applies (0 = one second's worth, at
        least 1).
    rate_limit_max_keys : int
        Devices and tokens each limiter tracks; beyond it the least recently seen is forgotten, so a
        flood of distinct keys cannot grow memory.
    metrics_port : int
        Port of the Prometheus ``/metrics`` endpoint (0 = off). With several workers, worker ``i``
        serves its own metrics on ``metrics_port + i``.
    metrics_host : str
        Address the metrics endpoint binds.
    log_format : str
        ``auto`` (JSON when stderr is not a terminal), ``json`` or ``text``.
    log_level : str
        ``DEBUG`` ... ``CRITICAL``.
    """

    listen: str = "127.0.0.1:50051"
    data_dir: str = "./ldp-data"
    operator_token: str = field(default="", repr=False)
    device_tokens: tuple[str, ...] = field(default=(), repr=False)
    enrolment: bool = False
    enrolment_secret: str = field(default="", repr=False)
    enrolment_rate: float = 100.0
    enrolment_burst: int = 1000
    enrolment_peer_rate: float = 1.0
    enrolment_peer_burst: int = 20
    allow_insecure_operator: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    max_receive_bytes: int = MAX_BATCH_BYTES
    max_send_bytes: int = 64 * 1024 * 1024
    max_batch_reports: int = MAX_BATCH_REPORTS
    max_concurrent_rpcs: int = 1024
    max_queued_calls: int = 512
    max_queued_bytes: int = 128 * 1024 * 1024
    worker_threads: int = 16
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    grace_period_s: float = 10.0
    tick_interval_s: float = 1.0
    watch_poll_interval_s: float = 0.5
    reuse_port: bool = False
    workers: int = 1
    device_rate_limit: float = 0.0
    device_rate_burst: int = 0
    token_rate_limit: float = 0.0
    token_rate_burst: int = 0
    rate_limit_max_keys: int = DEFAULT_MAX_KEYS
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_format: str = "auto"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        _check_str("listen", self.listen, nonempty=True)
        host, listen_port = split_listen(self.listen)
        _check_str("data_dir", self.data_dir, nonempty=True)
        _check_str("operator_token", self.operator_token)
        if self.operator_token:
            _check_token("operator_token", self.operator_token)
        tokens: Any = self.device_tokens
        if isinstance(tokens, list):
            object.__setattr__(self, "device_tokens", tuple(tokens))
        elif not isinstance(tokens, tuple):
            raise ConfigError(f"device_tokens must be a list of strings, got {type(tokens).__name__}")
        for i, token in enumerate(self.device_tokens):
            _check_str(f"device_tokens[{i}]", token, nonempty=True)
            _check_token(f"device_tokens[{i}]", token)
        for name in ("allow_insecure_operator", "reuse_port", "enrolment"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        _check_str("enrolment_secret", self.enrolment_secret)
        if self.enrolment and len(self.enrolment_secret.encode()) < _MIN_TOKEN:
            raise ConfigError(f"enrolment needs enrolment_secret (LDP_ENROLMENT_SECRET) of at least {_MIN_TOKEN} "
                              f"characters, shared by every collector process, got {len(self.enrolment_secret)}")
        for name in ("enrolment_rate", "enrolment_peer_rate"):
            object.__setattr__(self, name, _check_float(name, getattr(self, name), 1e-6, 1e9))
        _check_int("enrolment_burst", self.enrolment_burst, 1, 1_000_000_000)
        _check_int("enrolment_peer_burst", self.enrolment_peer_burst, 1, 1_000_000_000)
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            _check_str(name, getattr(self, name))
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key must be set together (got only "
                              f"{'tls_cert' if self.tls_cert else 'tls_key'})")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca (mTLS) needs tls_cert and tls_key")
        _check_int("max_receive_bytes", self.max_receive_bytes, 1024, 2**31 - 1)
        _check_int("max_send_bytes", self.max_send_bytes, 1024, 2**31 - 1)
        _check_int("max_batch_reports", self.max_batch_reports, 1, MAX_BATCH_REPORTS)
        _check_int("max_concurrent_rpcs", self.max_concurrent_rpcs, 0, 1_000_000)
        _check_int("max_queued_calls", self.max_queued_calls, 0, 1_000_000)
        _check_int("max_queued_bytes", self.max_queued_bytes, 0, 2**40)
        _check_int("worker_threads", self.worker_threads, 1, 1024)
        for name, low in (("keepalive_time_s", 1.0), ("keepalive_timeout_s", 0.1), ("grace_period_s", 0.0),
                          ("tick_interval_s", 0.01), ("watch_poll_interval_s", 0.01)):
            object.__setattr__(self, name, _check_float(name, getattr(self, name), low, 86_400.0))
        _check_int("workers", self.workers, 1, 64)
        for name in ("device_rate_limit", "token_rate_limit"):
            object.__setattr__(self, name, _check_float(name, getattr(self, name), 0.0, 1e9))
        _check_int("device_rate_burst", self.device_rate_burst, 0, 1_000_000_000)
        _check_int("token_rate_burst", self.token_rate_burst, 0, 1_000_000_000)
        _check_int("rate_limit_max_keys", self.rate_limit_max_keys, 1, 10_000_000)
        _check_int("metrics_port", self.metrics_port, 0, 65535)
        if self.metrics_port and self.metrics_port + self.workers - 1 > 65535:
            raise ConfigError(f"metrics_port + workers - 1 must be at most 65535 (worker i serves metrics on "
                              f"metrics_port + i), got {self.metrics_port} + {self.workers} - 1")
        _check_str("metrics_host", self.metrics_host, nonempty=True)
        wildcards = ("", "0.0.0.0", "::", "[::]")
        if (self.metrics_port and self.metrics_port <= listen_port < self.metrics_port + self.workers
                and (self.metrics_host == host.strip("[]") or self.metrics_host in wildcards or host in wildcards)):
            raise ConfigError(f"metrics_port {self.metrics_port} (worker i serves metrics on metrics_port + i) takes the "
                              f"listen port {listen_port} of {self.listen}; choose another metrics port")
        if self.log_format not in _LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(_LOG_FORMATS)}, got {self.log_format!r}")
        if not isinstance(self.log_level, str) or self.log_level.upper() not in _LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {self.log_level!r}")
        object.__setattr__(self, "log_level", self.log_level.upper())
        if not self.operator_token and not self.allow_insecure_operator and not is_loopback(host):
            raise ConfigError(
                f"operator_token is required when listening on a non-loopback address ({self.listen}); "
                "set LDP_OPERATOR_TOKEN, or allow_insecure_operator = true to run without one")

    @property
    def tls(self) -> bool:
        """Whether the server listens with TLS."""
        return bool(self.tls_cert)

    @property
    def operator_auth(self) -> bool:
        """Whether operator calls need a bearer token."""
        return bool(self.operator_token)

    def replace(self, **changes: Any) -> CollectorConfig:
        """A copy with some fields changed (validated again)."""
        try:
            return dataclasses.replace(self, **changes)
        except TypeError as exc:
            raise ConfigError(str(exc)) from exc


def split_listen(listen: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port``) and check the port; ``ConfigError`` on bad input."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"listen must be host:port, got {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"listen port must be an integer, got {port_text!r} in {listen!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"listen port must be in [0, 65535], got {port}")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as written in ``listen``) is only reachable from this machine."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_config(path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> CollectorConfig:
    """Build the configuration from defaults, a TOML file, ``LDP_*`` variables and overrides.

    Parameters
    ----------
    path : path-like, optional
        TOML file. ``None``: ``./ldp-collector.toml`` if it exists, else no file. A given path that
        does not exist is an error.
    env : mapping, optional
        The environment to read ``LDP_*`` variables from (default ``os.environ``). Every ``LDP_*``
        name in it must be a configuration variable (:func:`config_variables`), one of
        :data:`NON_CONFIG_VARIABLES` or start with :data:`TEST_VARIABLE_PREFIX`.
    overrides : mapping, optional
        Final values by key (``None`` values are ignored), e.g. from command-line flags.

    Returns
    -------
    CollectorConfig

    Raises
    ------
    ConfigError
        Unknown key or ``LDP_*`` variable (with the nearest known name), wrong type or out-of-range
        value, unreadable or non-UTF-8 file; the message names the key, variable or file.
    """
    known = {f.name: f for f in dataclasses.fields(CollectorConfig)}
    file_keys = set(known) | set(_FILE_ONLY_KEYS)
    values: dict[str, Any] = {}

    environ = os.environ if env is None else env
    # The environment is checked first: a mistyped variable is reported even when the file is bad too.
    variables = config_variables()
    unknown = [name for name in sorted(environ) if name.startswith(_ENV_PREFIX) and name not in variables
               and name not in NON_CONFIG_VARIABLES and not name.startswith(TEST_VARIABLE_PREFIX)]
    if unknown:
        raise ConfigError(_unknown("environment variable", unknown, variables | NON_CONFIG_VARIABLES, _ENV_PREFIX)
                          + f"; {_ENV_PREFIX}* variables set the configuration keys ({_ENV_PREFIX}LISTEN, "
                          f"{_ENV_PREFIX}DATA_DIR ...), {TEST_VARIABLE_PREFIX}* is left to the test suite")

    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        values.update(_read_toml(Path(path), file_keys))

    for key in sorted(file_keys):
        name = _ENV_PREFIX + key.upper()
        if name in environ:
            values[key] = _from_env(name, key, environ[name], known)

    for key, value in (overrides or {}).items():
        if key not in file_keys:
            raise ConfigError(_unknown("configuration key", [key], file_keys))
        if value is not None:
            values[key] = value

    token_file = values.pop("operator_token_file", None)
    if token_file and not values.get("operator_token"):
        tokens = _read_tokens("operator_token_file", token_file)
        if len(tokens) != 1:
            raise ConfigError(f"operator_token_file {token_file!r} must hold exactly one token, got {len(tokens)}")
        values["operator_token"] = tokens[0]
    tokens_file = values.pop("device_tokens_file", None)
    if tokens_file:
        values["device_tokens"] = tuple(values.get("device_tokens", ())) + tuple(
            _read_tokens("device_tokens_file", tokens_file))

    for key, value in values.items():
        values[key] = _coerce(key, value, known[key])
    try:
        return CollectorConfig(**values)
    except TypeError as exc:  # a TOML value of an unexpected shape reaching the dataclass
        raise ConfigError(str(exc)) from exc


def config_variables() -> frozenset[str]:
    """Every environment variable :func:`load_config` reads: ``LDP_`` + each upper-cased key."""
    keys = [f.name for f in dataclasses.fields(CollectorConfig)] + list(_FILE_ONLY_KEYS)
    return frozenset(_ENV_PREFIX + key.upper() for key in keys)


def _unknown(what: str, names: Iterable[str], known: Iterable[str], prefix: str = "") -> str:
    """``unknown <what> X (did you mean Y?)``: one line, the nearest known name for each.

    Names are compared without ``prefix``, which they all share and which would otherwise make
    any two of them look alike, and without case (``LDP_data_dir`` is ``LDP_DATA_DIR``).
    """
    by_stem = {name.removeprefix(prefix).casefold(): name for name in known}
    parts = []
    for name in names:
        close = difflib.get_close_matches(name.removeprefix(prefix).casefold(), sorted(by_stem), n=1)
        parts.append(f"{name} (did you mean {by_stem[close[0]]}?)" if close else name)
    return f"unknown {what}{'s' if len(parts) > 1 else ''} {', '.join(parts)}"


def _read_toml(path: Path, keys: set[str]) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {str(path)!r}: {exc}") from exc
    except UnicodeDecodeError as exc:  # tomllib decodes the whole file first: TOML is UTF-8
        raise ConfigError(f"configuration file {str(path)!r} is not UTF-8 text (TOML is UTF-8): "
                          f"{exc.reason} at byte {exc.start}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {str(path)!r} is not valid TOML: {exc}") from exc
    table = data.pop("collector", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [collector] must be a table")
    merged = {**data, **table}
    unknown = sorted(set(merged) - keys)
    if unknown:
        raise ConfigError(f"{path}: {_unknown('configuration key', unknown, keys)}")
    return merged


def _read_tokens(key: str, file: Any) -> list[str]:
    if not isinstance(file, str) or not file:
        raise ConfigError(f"{key} must be a file path, got {file!r}")
    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {file!r}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{key}: {file!r} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _from_env(name: str, key: str, raw: str, known: Mapping[str, dataclasses.Field[Any]]) -> Any:
    """Parse an environment string by the type of ``key``; errors name the variable."""
    if key not in known:
        return raw  # the *_file keys
    tp = known[key].type
    try:
        if tp == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            raise ConfigError(f"{key} must be true or false, got {raw!r}")
        if tp == "int":
            try:
                return int(raw.strip())
            except ValueError:
                raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
        if tp == "float":
            try:
                return float(raw.strip())
            except ValueError:
                raise ConfigError(f"{key} must be a number, got {raw!r}") from None
        if tp == "tuple[str, ...]":
            return tuple(t.strip() for t in raw.split(",") if t.strip())
        return raw
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _coerce(key: str, value: Any, f: dataclasses.Field[Any]) -> Any:
    """Accept TOML's natural types: lists for tuples, ints where floats are expected."""
    if f.type == "tuple[str, ...]" and isinstance(value, list):
        return tuple(value)
    if f.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _check_str(name: str, value: Any, *, nonempty: bool = False) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {type(value).__name__}")
    if nonempty and not value:
        raise ConfigError(f"{name} must not be empty")


def _check_token(name: str, value: str) -> None:
    if not _MIN_TOKEN <= len(value) <= _MAX_TOKEN or not value.isascii() or not value.isprintable() or " " in value:
        raise ConfigError(f"{name} must be {_MIN_TOKEN} to {_MAX_TOKEN} printable ASCII characters without "
                          f"spaces, got {len(value)} characters")


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def _check_float(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)
