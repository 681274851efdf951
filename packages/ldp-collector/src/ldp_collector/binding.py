"""Binding the collector's listening addresses, with errors that say what is wrong.

gRPC reports a port it cannot bind as ``Failed to bind to address ...`` (and logs the reason
through its own C logger), so the collector binds the address itself first, with the socket
options the gRPC server will use, and turns the operating system's error into one line naming
the address: ``cannot listen on 127.0.0.1:50051: address already in use``. The same message
serves the supervisor of ``serve --workers N``, which keeps such a socket to hold the port.
"""

from __future__ import annotations

import errno
import socket

from .config import split_listen

__all__ = ["bind_error", "reserve_address"]


def bind_error(what: str, address: str, exc: OSError) -> OSError:
    """An ``OSError`` (same errno) whose message names ``address`` and the reason in words.

    Parameters
    ----------
    what : str
        What could not be done, e.g. ``"cannot listen on"``, ``"cannot serve metrics on"``.
    address : str
        ``host:port`` as the user wrote it.
    exc : OSError
        The error of ``bind``.
    """
    if exc.errno == errno.EADDRINUSE:
        reason = "address already in use (another process is listening on that port)"
    elif exc.strerror:
        reason = exc.strerror[:1].lower() + exc.strerror[1:]
    else:
        reason = str(exc)
    error = OSError(f"{what} {address}: {reason}")
    error.errno = exc.errno
    return error


def reserve_address(listen: str, *, reuse_port: bool) -> socket.socket:
    """A TCP socket bound (not listening) to ``listen`` with the gRPC server's options.

    The gRPC server sets ``SO_REUSEADDR`` on its listeners (so a port that only has connections in
    TIME_WAIT binds) and ``SO_REUSEPORT`` when ``reuse_port`` is on; so does this socket, so it
    binds exactly when the server will. Close it to release the port, or keep it to hold the port
    for processes that bind it with ``SO_REUSEPORT`` too (a socket that is not listening takes no
    connections).

    Parameters
    ----------
    listen : str
        ``host:port`` (``[v6]:port``); port 0 picks a free port (see ``getsockname``).
    reuse_port : bool
        Set ``SO_REUSEPORT``.

    Raises
    ------
    OSError
        The address cannot be bound; the message names it (:func:`bind_error`).
    """
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise bind_error("cannot listen on", listen, exc) from exc
    return sock
