"""Test helpers shipped with edgeinfer: tiny models built in code, for tests and smoke checks.

These need the ``onnx`` package (the ``dev`` extra); nothing in the runtime imports them.
"""
