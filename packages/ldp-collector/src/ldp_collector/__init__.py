"""ldp_collector: the gRPC collector service of the LDP project."""

__version__ = "0.1.0"
