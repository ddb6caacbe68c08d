"""MQTT benchmark: results through the durable outbox to a local mosquitto at QoS 1.

    python3 bench/mqtt.py [--rounds 5] [--messages 20000] [--no-write]

1. Sustained throughput: N results put into the outbox (``MqttPlumbing.put``, as the MQTT sink
   does after encoding) until the broker acknowledged the last one, against paho publishing the
   same payloads directly at QoS 1 until the last PUBACK; each round in fresh processes,
   alternating, medians.
2. Replay after an outage: N results waiting, the broker comes up; time from connect to an
   empty outbox, unpaced (``replay_rate`` unlimited: the capacity) and at a set ``replay_rate``
   (the pacing holds).
3. Resident memory while 100,000 results wait on disk (broker unreachable), and while they
   drain: the outbox keeps only the in-flight window in memory.
4. Cost of one ``put`` (a committed transaction) with ``synchronous=NORMAL`` and ``FULL``.

The results replace the mqtt section of docs/benchmarks.md (between its markers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

# Shared by the children: a broker, a realistic result payload, the plumbing.
_PRELUDE = r"""
import json, sys, tempfile, threading, time, uuid
import numpy as np
from edgeinfer.config.mqtt import MqttConfig, OutboxConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.frames import Detection, Frame, ModelRef, Result, TaskResult
from edgeinfer.mqtt.publisher import MqttPlumbing
from edgeinfer.runtime.memory import rss_mb
from edgeinfer.testing.mosquitto import Mosquitto, free_port

frame = Frame(index=1, ts=0.0, wall=time.time(), data=np.zeros((480, 640, 3), np.uint8))
task = TaskResult(detections=(Detection("person", 0, 0.91, (10.0, 20.0, 200.0, 400.0)),
                              Detection("dog", 16, 0.77, (220.0, 240.0, 380.0, 460.0))))
PAYLOAD = Result(1, time.time(), "cam", frame, ModelRef("nudenet-320n", "1", "ab" * 32),
                 "CPUExecutionProvider", (1.2, 20.5, 0.4), task).to_json()
TOPIC = "edgeinfer/dev/cam/result"

def plumbing(port, **outbox):
    cfg = MqttConfig(host="127.0.0.1", port=port, outbox=OutboxConfig(**outbox),
                     reconnect=ReconnectConfig(initial_s=0.05, max_s=0.1))
    return MqttPlumbing(cfg, "dev", tempfile.mkdtemp(prefix="edgeinfer-bench-"))

def wait(cond):
    while not cond():
        time.sleep(0.001)
"""

_THROUGHPUT = _PRELUDE + r"""
variant, n = sys.argv[1], int(sys.argv[2])
with Mosquitto() as broker:
    if variant == "paho":
        import paho.mqtt.client as paho
        acked = [0]
        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="bench-" + uuid.uuid4().hex[:6],
                        protocol=paho.MQTTv5)
        c.max_inflight_messages_set(100)  # what edgeinfer's client uses
        c.on_publish = lambda *a: acked.__setitem__(0, acked[0] + 1)
        c.connect(broker.host, broker.port)
        c.loop_start()
        time.sleep(0.3)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(n):
            c.publish(TOPIC, PAYLOAD, 1)
        wait(lambda: acked[0] >= n)
    else:
        mqtt = plumbing(broker.port)
        mqtt.start()
        mqtt.client.wait_connected(10)
        time.sleep(0.3)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(1, n + 1):
            mqtt.put("cam", i, PAYLOAD)
        wait(lambda: mqtt.publisher.acked >= n)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if variant == "paho":
        c.loop_stop()
    else:
        mqtt.stop()
print(json.dumps({"rate": n / elapsed, "cpu_us": cpu / n * 1e6}))
"""

_REPLAY = _PRELUDE + r"""
n, rate = int(sys.argv[1]), float(sys.argv[2])
port = free_port()
mqtt = plumbing(port, replay_rate=rate, max_messages=max(n, 1))
for i in range(1, n + 1):
    mqtt.put("cam", i, PAYLOAD)
mqtt.start()  # the broker is not there: results wait
with Mosquitto(port=port):
    mqtt.client.wait_connected(10)
    t0 = time.perf_counter()
    wait(lambda: mqtt.outbox.depth == 0)
    elapsed = time.perf_counter() - t0
    replayed = mqtt.publisher.replayed
    mqtt.stop()
print(json.dumps({"seconds": elapsed, "rate": n / elapsed, "replayed": replayed}))
"""

_MEMORY = _PRELUDE + r"""
n = int(sys.argv[1])
port = free_port()
mqtt = plumbing(port, max_messages=n)
mqtt.start()  # nothing listens on the port: everything waits on disk
for i in range(1, 1001):
    mqtt.put("cam", i, PAYLOAD)
base = rss_mb()
for i in range(1001, n + 1):
    mqtt.put("cam", i, PAYLOAD)
time.sleep(0.5)
waiting = rss_mb()
size = sum(p.stat().st_size for p in mqtt.outbox.path.parent.glob(mqtt.outbox.path.name + "*")) / 2**20
peak = waiting
with Mosquitto(port=port):
    while mqtt.outbox.depth:
        peak = max(peak, rss_mb())
        time.sleep(0.05)
mqtt.stop()
print(json.dumps({"base_mb": base, "waiting_mb": waiting, "drain_peak_mb": peak,
                  "disk_mb": size, "depth": n}))
"""

_PUT_COST = r"""
import json, sys, tempfile, time
from edgeinfer.mqtt.outbox import Outbox
sync, n = sys.argv[1], int(sys.argv[2])
ob = Outbox(tempfile.mkdtemp() + "/o.sqlite3", synchronous=sync)
payload = b"x" * 450
lat = []
for i in range(n):
    t = time.perf_counter()
    ob.put("cam", i, "edgeinfer/dev/cam/result", payload, 1)
    lat.append(time.perf_counter() - t)
lat.sort()
print(json.dumps({"p50_us": lat[n // 2] * 1e6, "p99_us": lat[int(n * 0.99)] * 1e6}))
"""


def _child(code: str, *args: object) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def throughput(rounds: int, n: int) -> dict[str, float]:
    ours, raw, cpu_ours, cpu_raw, ratios = [], [], [], [], []
    for _ in range(rounds):
        r = _child(_THROUGHPUT, "paho", n)
        o = _child(_THROUGHPUT, "outbox", n)
        raw.append(r["rate"])
        ours.append(o["rate"])
        cpu_raw.append(r["cpu_us"])
        cpu_ours.append(o["cpu_us"])
        ratios.append(o["rate"] / r["rate"])
        print(f"  round: paho {r['rate']:.0f}/s, outbox {o['rate']:.0f}/s", file=sys.stderr)
    med = statistics.median
    return {"ours": med(ours), "raw": med(raw), "ratio": med(ratios),
            "cpu_ours": med(cpu_ours), "cpu_raw": med(cpu_raw)}


def render(tp: dict[str, float], replay: dict[str, float], paced: dict[str, float],
           paced_rate: float, mem: dict[str, float], cost: dict[str, dict[str, float]],
           args: argparse.Namespace) -> str:
    n = args.messages
    lines = [
        f"Payload: a two-detection result JSON ({args.payload_bytes} bytes), one pipeline, "
        f"QoS 1, mosquitto 2 on loopback in the same machine. {machine_facts()}",
        "",
        "| measure | edgeinfer (outbox) | paho direct | ratio | target |",
        "|---|---|---|---|---|",
        f"| sustained results/s, {n:,} put until the last PUBACK ({args.rounds} alternating "
        f"rounds in fresh processes, medians) | {tp['ours']:,.0f} | {tp['raw']:,.0f} | "
        f"{tp['ratio']:.2f} | >= 0.8 |",
        f"| CPU of the publishing process per result, us | {tp['cpu_ours']:.0f} | "
        f"{tp['cpu_raw']:.0f} | | report |",
        f"| replay after an outage: {n:,} waiting, broker back, to an empty outbox "
        f"(`replay_rate` unlimited) | {replay['rate']:,.0f}/s ({replay['seconds']:.1f} s) | | "
        "| report |",
        f"| the same paced at `replay_rate: {paced_rate:g}` ({args.paced:,} waiting) | "
        f"{paced['rate']:,.0f}/s | | {paced['rate'] / paced_rate:.2f} x the set rate | ~1 |",
        f"| resident memory while {mem['depth']:,.0f} results wait on disk "
        f"({mem['disk_mb']:.0f} MiB of SQLite), growth over 1,000 waiting, MiB | "
        f"+{mem['waiting_mb'] - mem['base_mb']:.1f} | | | bounded |",
        f"| the same, peak while they drain to the broker | "
        f"+{mem['drain_peak_mb'] - mem['base_mb']:.1f} | | | bounded |",
        f"| one `put` (a committed transaction), `synchronous=NORMAL` (default), p50 / p99 us "
        f"| {cost['NORMAL']['p50_us']:.0f} / {cost['NORMAL']['p99_us']:.0f} | | | report |",
        f"| the same with `synchronous=FULL` (fsync per result) | "
        f"{cost['FULL']['p50_us']:.0f} / {cost['FULL']['p99_us']:.0f} | | | report |",
    ]
    return "\n".join(lines) + "\n\n" + _NOTES


_NOTES = """Reading the MQTT numbers:

- Every result is committed to SQLite before `put` returns (what makes a `kill -9` lose
  nothing), then taken, published and deleted on its PUBACK: about twice the CPU per result of
  paho alone, and all of it under one GIL with paho's network thread, so the ratio is a CPU
  ratio. The 0.8 goal is not met; the split per result is about 17 us `put`, 17 us publisher
  thread (take, hand to the client, batched deletes) and the client's network thread, which
  costs more when another thread feeds it than when paho drains its own queue. For scale: a
  pipeline at 30 results/s spends about 0.3 % of one core on this.
- Refilling the window in bursts of a quarter window rather than one by one gained 20-30 %;
  `synchronous=FULL` would add an fsync per result (the FULL row), and a batching writer
  thread would break the `kill -9` guarantee, so neither is used.
- The paced replay runs slightly above `replay_rate` because the first window goes at once.
- Memory does not grow with the backlog: waiting results are on disk, SQLite's page cache is
  bounded (2 MiB), and the publisher holds at most a window (256) of them."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--paced", type=int, default=3_000)
    parser.add_argument("--memory", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    args.payload_bytes = int(_child(_PRELUDE + "print(json.dumps({'n': len(PAYLOAD)}))")["n"])
    tp = throughput(args.rounds, args.messages)
    replay = _child(_REPLAY, args.messages, 1e9)
    paced_rate = 500.0
    paced = _child(_REPLAY, args.paced, paced_rate)
    mem = _child(_MEMORY, args.memory)
    cost = {sync: _child(_PUT_COST, sync, 20_000 if sync == "NORMAL" else 2_000)
            for sync in ("NORMAL", "FULL")}
    text = render(tp, replay, paced, paced_rate, mem, cost, args)
    print(text)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "mqtt", "MQTT through the durable outbox",
                      text, f"python3 bench/mqtt.py --rounds {args.rounds} "
                      f"--messages {args.messages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
