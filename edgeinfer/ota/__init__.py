"""Over-the-air model updates: keys and signed manifests, chunked transfer over MQTT, the
content-addressed store, verification, swap with a health gate, and the push client.

The wire protocol is in ``docs/ota.md``; ``protocol`` holds its topics and status message.
"""
