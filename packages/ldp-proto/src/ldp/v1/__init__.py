"""Generated Python code of the ``ldp.v1`` wire API (do not edit; see scripts/generate_proto.py)."""
