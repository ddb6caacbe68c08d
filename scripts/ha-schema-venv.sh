#!/bin/sh
# Make a throwaway virtualenv with Home Assistant Core's MQTT discovery code, for
# tests/control/test_discovery.py::test_discovery_passes_home_assistant_schemas:
#
#   scripts/ha-schema-venv.sh /tmp/ha-venv
#   EDGEINFER_HA_PYTHON=/tmp/ha-venv/bin/python python3 -m pytest tests/control/test_discovery.py
#
# Home Assistant 2024.3.3 is the newest release for Python 3.11. Only the packages its mqtt
# component's schema modules import are installed (not its full dependency set, which pins
# paho-mqtt 1.x among others: hence a venv of its own). About 60 MB from PyPI.
set -eu
dir=${1:?usage: $0 VENV_DIR}
python3 -m venv "$dir"
"$dir/bin/pip" install -q --disable-pip-version-check --no-deps homeassistant==2024.3.3
"$dir/bin/pip" install -q --disable-pip-version-check \
    aiohttp==3.9.3 aiohttp-fast-url-dispatcher==0.3.0 aiohttp-zlib-ng==0.3.1 astral==2.2 \
    async-interrupt==1.1.1 atomicwrites-homeassistant==1.4.1 attrs==23.2.0 \
    awesomeversion==24.2.0 ciso8601==2.3.1 cryptography==42.0.5 ifaddr==0.2.0 Jinja2==3.1.3 \
    lru-dict==1.3.0 orjson==3.9.15 packaging paho-mqtt==1.6.1 PyJWT==2.8.0 \
    python-slugify==8.0.4 PyYAML==6.0.1 requests==2.31.0 "typing-extensions>=4.10,<5" \
    ulid-transform==0.9.0 "urllib3>=1.26.5,<2" voluptuous==0.13.1 \
    voluptuous-serialize==2.6.0 yarl==1.9.4
"$dir/bin/python" -c "import homeassistant.components.mqtt.sensor, homeassistant.components.mqtt.binary_sensor"
echo "$dir/bin/python"
