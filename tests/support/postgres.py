"""A throwaway PostgreSQL server for tests, and a fresh schema on it for each test.

``postgres_server`` (session scope) starts one: it finds ``initdb`` and ``pg_ctl`` on ``PATH`` or
under ``/usr/lib/postgresql/<version>/bin``, initializes a cluster in a temporary directory (as an
unprivileged user when the tests run as root: PostgreSQL refuses to run as root), starts it on
127.0.0.1 on a free port with ``fsync`` on (acknowledged means on disk, as in production), and
stops it at the end. If ``LDP_TEST_POSTGRES_URL`` is set, that server is used instead and nothing
is started. Without the binaries the tests that need a server are skipped with a message saying
how to install them.

``postgres_url`` (function scope) creates a new schema and yields a URL whose ``search_path`` is
that schema, so each test starts from an empty database without the cost of ``CREATE DATABASE``;
the schema is dropped afterwards.

Use in a test module::

    from support.postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "find_postgres_bin", "postgres_server", "postgres_url", "schema_url"]

URL_ENV = "LDP_TEST_POSTGRES_URL"
INSTALL_HINT = ("install the PostgreSQL server (Debian/Ubuntu: apt-get install postgresql; it provides initdb "
                "and pg_ctl under /usr/lib/postgresql/<version>/bin) or point LDP_TEST_POSTGRES_URL at a server")
_USER = "ldp"
_DATABASE = "ldp_test"
_START_TIMEOUT_S = 60


@dataclass(frozen=True)
class PostgresServer:
    """A running server: ``url`` connects to its test database as a superuser."""

    url: str
    data_dir: Path | None  # None for a server given by LDP_TEST_POSTGRES_URL


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (PATH first, then the newest distribution version)."""
    on_path = shutil.which("initdb")
    if on_path is not None:
        directory = Path(os.path.realpath(on_path)).parent
        if (directory / "pg_ctl").exists():
            return directory
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: [int(part) if part.isdigit() else 0 for part in Path(p).parts[-3].split(".")])
    for initdb in reversed(candidates):
        directory = Path(initdb).parent
        if (directory / "pg_ctl").exists():
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_as(user: str | None) -> list[str]:
    """The command prefix that runs a program as ``user`` (nothing when not root)."""
    if user is None:
        return []
    runuser = shutil.which("runuser")
    if runuser is not None:
        return [runuser, "-u", user, "--"]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and neither runuser nor setpriv exists to start PostgreSQL as another user")
    entry = pwd.getpwnam(user)
    return [setpriv, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]


def _unprivileged_user() -> str | None:
    """A user to run PostgreSQL as when we are root (None when we are not)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    pytest.skip("running as root and no unprivileged user (postgres, nobody) exists to run PostgreSQL")


def _start(bin_dir: Path, root: Path) -> PostgresServer:
    user = _unprivileged_user()
    prefix = _run_as(user)
    data_dir, socket_dir = root / "data", root / "socket"
    socket_dir.mkdir()
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (root, socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    # --no-sync only skips initdb's final flush of the template files; the server runs with fsync on.
    subprocess.run([*prefix, str(bin_dir / "initdb"), "-D", str(data_dir), "-U", _USER, "--auth=trust",
                    "-E", "UTF8", "--locale=C", "--no-sync"],
                   check=True, capture_output=True, env=env, cwd=root)
    for _ in range(5):  # the free port may be taken by the time the server binds it
        port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={socket_dir} "
                   "-c fsync=on -c synchronous_commit=on -c max_connections=200 -c shared_buffers=128MB")
        started = subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-l", str(root / "server.log"), "-w",
             "-t", str(_START_TIMEOUT_S), "-o", options, "start"],
            capture_output=True, env=env, cwd=root)
        if started.returncode == 0:
            break
    else:
        log = (root / "server.log").read_text(errors="replace")[-3000:] if (root / "server.log").exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {started.stderr.decode(errors='replace')}\n{log}")
    base = f"postgresql://{_USER}@127.0.0.1:{port}"
    import psycopg

    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {_DATABASE}")
    return PostgresServer(url=f"{base}/{_DATABASE}", data_dir=data_dir)


def _stop(bin_dir: Path, server: PostgresServer) -> None:
    assert server.data_dir is not None
    prefix = _run_as(_unprivileged_user())
    subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(server.data_dir), "-m", "fast", "-w", "stop"],
                   capture_output=True, check=False)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL server for the whole session (see the module docstring)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'ldp-collector[postgres]'")
    given = os.environ.get(URL_ENV)
    if given:
        yield PostgresServer(url=given, data_dir=None)
        return
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        pytest.skip(f"PostgreSQL tests need a server: {INSTALL_HINT}")
    root = Path(tempfile.mkdtemp(prefix="ldp-pg-"))
    try:
        server = _start(bin_dir, root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield server
    finally:
        _stop(bin_dir, server)
        shutil.rmtree(root, ignore_errors=True)


def schema_url(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` (libpq ``options``)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A URL of an empty schema of its own on the session's server; dropped after the test."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema_url(postgres_server.url, schema)
    finally:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(postgres_server.url, autocommit=True) as conn:
                    conn.execute("SET lock_timeout = '5s'")
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")
                break
            except psycopg.errors.LockNotAvailable:  # a store left open by a failed test still holds it
                if time.monotonic() > deadline:
                    break
