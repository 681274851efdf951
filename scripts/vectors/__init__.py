"""The areas of the wire protocol's test vectors: one module each (see ``generate_vectors.py``)."""
