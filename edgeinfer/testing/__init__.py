"""Test helpers shipped with edgeinfer: tiny models built in code, for tests and smoke checks.

``onnx_models`` needs the ``onnx`` package (the ``dev`` extra); ``tflite_models`` needs only
ai-edge-litert (its flatbuffers schema) and numpy. Nothing in the runtime imports them.
"""
