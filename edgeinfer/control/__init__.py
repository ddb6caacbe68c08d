"""The control plane: commands arriving on MQTT and the daemon's answers. Never imported by the
data plane (sources, tasks, the pipeline engine)."""
