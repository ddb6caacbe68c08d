"""Validate edgeinfer's discovery messages with Home Assistant's own MQTT code.

Run by tests/control/test_discovery.py with the Python of a virtualenv that has the
``homeassistant`` package (see scripts/ha-schema-venv.sh), not edgeinfer's: Home Assistant
pins paho-mqtt 1.x. Reads JSON on stdin: ``{"messages": [[topic, payload], ...], "samples":
{topic: [payload, ...]}}``; prints one problem per line and exits 1 if there is any.

Each config topic must match Home Assistant's discovery topic pattern, each payload must pass
the component's ``DISCOVERY_SCHEMA`` without a key being dropped as unknown, and each
``value_template`` (Home Assistant's template syntax is Jinja2's) must render every sample of
its state topic to a state the entity takes: ``ON``/``OFF`` for a binary sensor, a number (or
``None``, Home Assistant's "unknown") for a sensor with a state class.
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    from homeassistant.components.mqtt.discovery import TOPIC_MATCHER
    from homeassistant.const import __version__ as ha_version
    from homeassistant.exceptions import HomeAssistantError
    import jinja2
    import voluptuous as vol

    data = json.load(sys.stdin)
    env = jinja2.Environment()
    problems: list[str] = []
    unique_ids: dict[str, str] = {}
    for topic, payload in data["messages"]:
        prefix, _, rest = topic.partition("/")
        match = TOPIC_MATCHER.fullmatch(rest)
        if match is None:
            problems.append(f"{topic}: not a discovery topic Home Assistant takes")
            continue
        component = match.group("component")
        schema = importlib.import_module(f"homeassistant.components.mqtt.{component}")
        config = json.loads(payload)
        try:
            valid = schema.DISCOVERY_SCHEMA(dict(config, platform="mqtt"))
        except (vol.Invalid, HomeAssistantError) as exc:
            problems.append(f"{topic}: {exc}")
            continue
        dropped = set(config) - set(valid)
        if dropped:
            problems.append(f"{topic}: keys Home Assistant does not know: {sorted(dropped)}")
        other = unique_ids.setdefault(config["unique_id"], topic)
        if other != topic:
            problems.append(f"{topic}: unique_id {config['unique_id']} also in {other}")
        template = env.from_string(config["value_template"])
        for sample in data["samples"].get(config["state_topic"], []):
            state = template.render(value_json=json.loads(sample)).strip()
            if component == "binary_sensor" and state not in ("ON", "OFF"):
                problems.append(f"{topic}: renders {state!r}, not ON/OFF")
            elif "state_class" in config and state != "None":
                try:
                    float(state)
                except ValueError:
                    problems.append(f"{topic}: renders {state!r}, not a number")
        for availability in config["availability"]:
            avail = env.from_string(availability["value_template"])
            for sample in data["samples"].get(availability["topic"], []):
                state = avail.render(value_json=json.loads(sample))
                if state not in ("online", "offline"):
                    problems.append(f"{topic}: availability renders {state!r}")
    for problem in problems:
        print(problem)
    print(f"checked {len(data['messages'])} configs with Home Assistant {ha_version}",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
