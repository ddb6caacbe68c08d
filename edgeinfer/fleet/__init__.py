"""The fleet side, never imported by the device: ``edgeinfer collect`` writes every device's
results, events and status into PostgreSQL exactly once, from an MQTT broker (shared
subscription, acknowledged after the commit) or a NATS JetStream cluster (durable pull
consumer); ``edgeinfer fleet`` lists the devices (``docs/fleet.md``).

Modules: `records` (parsing untrusted device messages), `db` (schema migrations, partitions,
idempotent batched writes, retention), `rejected` (the caps of the rejected table),
`collector` (the network thread enqueues, the writer thread batches, commits, then
acknowledges), `mqtt_source`, `nats_source`, `listing`.
"""
