"""The REST API, live view and events of a real `WebServer` serving a real BlazeFace pipeline
(the scene video made from real photographs), over real HTTP on loopback."""

from __future__ import annotations

import io
import re
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from edgeinfer import samples
from edgeinfer.errors import ConfigError
from edgeinfer.web.app import WebApp

PIPELINE = "scene"  # conftest's pipeline
Client = Any  # conftest's Client (fixtures client, client_of)


def _jpeg_size(data: bytes) -> tuple[int, int]:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return image.shape[1], image.shape[0]


def test_status_pipelines_and_headers(client: Client) -> None:
    r = client.get("/v1/status")
    assert r.status == 200
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["X-Frame-Options"] == "DENY"
    assert r.headers["Cache-Control"] == "no-store"
    data = r.json()
    assert data["device_id"] == "web-test" and data["pipelines"][PIPELINE]["processed"] > 0
    assert data["http"]["requests"] >= 1
    pipelines = client.get("/v1/pipelines").json()
    [p] = pipelines
    assert p["name"] == PIPELINE and p["task"] == "detect" and p["state"] == "running"
    assert p["health"] == {"state": "running", "reason": "", "retries": 0, "next_retry_at": None}
    assert p["model"]["sha256"] and p["frame"] == {"width": 640, "height": 480}
    assert [z["name"] for z in p["zones"]] and len(p["zones"][0]["points"]) == 4
    assert len(p["lines"][0]["points"]) == 2
    assert p["urls"]["live"] == f"/v1/pipelines/{PIPELINE}/live.mjpg"


def test_snapshot(client: Client) -> None:
    r = client.get(f"/v1/pipelines/{PIPELINE}/snapshot.jpg?quality=50")
    assert r.status == 200 and r.headers["Content-Type"] == "image/jpeg"
    assert _jpeg_size(r.body) == (640, 480)
    bad = client.get(f"/v1/pipelines/{PIPELINE}/snapshot.jpg?quality=0")
    assert bad.status == 400 and "quality" in bad.json()["error"]
    missing = client.get("/v1/pipelines/nope/snapshot.jpg")
    assert missing.status == 404 and "nope" in missing.json()["error"]
    assert PIPELINE in missing.json()["error"]  # names the pipelines there are


def test_latency_histogram(client: Client, pipeline: Any) -> None:
    # The pipeline keeps running: the histogram holds what was inferred when it was made, so
    # between the counts read before and after the request (read once after, it raced: 2 == 3).
    before = min(pipeline.stats.infer.count, 512)
    data = client.get(f"/v1/pipelines/{PIPELINE}/latency").json()
    after = min(pipeline.stats.infer.count, 512)
    bins = data["bins_ms"]
    assert bins == sorted(bins) and len(data["infer"]["counts"]) == len(bins)
    assert before <= sum(data["infer"]["counts"]) <= after
    assert sum(data["end_to_end"]["counts"]) > 0
    assert client.get("/v1/pipelines/x/latency").status == 404


def test_unknown_route_and_method_are_json_4xx(client: Client) -> None:
    r = client.get("/v1/nothing")
    assert r.status == 404 and "error" in r.json()
    r = client.call("DELETE", "/v1/status")
    assert r.status == 405 and "error" in r.json()


# -- POST /v1/infer -------------------------------------------------------------------------------
def _reference(pipeline: Any, blazeface_path: Path, data: bytes) -> list[dict[str, Any]]:
    """What Model.run and the task make of the image (decoded the same way: Pillow)."""
    from edgeinfer.config.pipeline import DetectTask as DetectConfig
    from edgeinfer.frames import Frame
    from edgeinfer.model import load_model
    from edgeinfer.tasks.detect import DetectTask

    bgr = np.ascontiguousarray(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[:, :, ::-1])
    with load_model(blazeface_path, threads=1, probe=False) as model:
        task = DetectTask(DetectConfig(decoder="blazeface", score_threshold=0.6), model)
        frame = Frame(index=0, ts=0.0, wall=0.0, data=bgr)
        feeds, context = task.preprocess(frame)
        part = task.postprocess(model.run(feeds), frame, context)
    return part.to_dict()["detections"]


def _encode(fmt: str) -> bytes:
    image = samples.load_image("astronaut")  # BGR
    ok, buf = cv2.imencode(f".{fmt}", image)
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("fmt", ["jpg", "png"])
def test_infer_matches_model_run(client: Client, pipeline: Any, blazeface_path: Path,
                                 fmt: str) -> None:
    data = _encode(fmt)
    ctype = "image/jpeg" if fmt == "jpg" else "image/png"
    r = client.call("POST", f"/v1/infer?pipeline={PIPELINE}", data, {"Content-Type": ctype})
    assert r.status == 200, r.body
    got = r.json()
    expected = _reference(pipeline, blazeface_path, data)
    assert expected, "the reference finds the face"
    assert got["detections"] == expected
    assert got["pipeline"] == PIPELINE and got["model"]["sha256"] == pipeline.model.sha256
    h, w = samples.load_image("astronaut").shape[:2]
    assert got["image"] == {"width": w, "height": h}
    assert set(got["latency_ms"]) == {"pre", "infer", "post"} and got["latency_ms"]["infer"] > 0
    assert "track_id" not in got["detections"][0]  # no tracking on a single image
    assert pipeline.model.sharers() == [PIPELINE]  # the request's handle was given back


def test_infer_multipart(client: Client, pipeline: Any, blazeface_path: Path) -> None:
    data = _encode("jpg")
    boundary = "xYzBoundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"a.jpg\"\r\nContent-Type: image/jpeg\r\n\r\n").encode() + data + \
        f"\r\n--{boundary}--\r\n".encode()
    r = client.call("POST", f"/v1/infer?pipeline={PIPELINE}", body,
                    {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status == 200, r.body
    assert r.json()["detections"] == _reference(pipeline, blazeface_path, data)
    empty = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n"
             f"--{boundary}--\r\n").encode()
    r = client.call("POST", f"/v1/infer?pipeline={PIPELINE}", empty,
                    {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status == 400 and "file" in r.json()["error"]


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk
            + struct.pack(">I", zlib.crc32(chunk))
            + struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND")))


def test_infer_refusals(make_server: Any, client_of: Any) -> None:
    client = client_of(make_server(max_upload_mb=0.05, max_pixels=1024 * 1024))
    url = f"/v1/infer?pipeline={PIPELINE}"
    jpeg = {"Content-Type": "image/jpeg"}
    big = client.call("POST", url, b"\xff" * 80_000, jpeg)
    assert big.status == 413 and "max_upload_mb" in big.json()["error"]
    bomb = client.call("POST", url, _png_header(100_000, 100_000), {"Content-Type": "image/png"})
    assert bomb.status == 413 and "max_pixels" in bomb.json()["error"]
    over = client.call("POST", url, _png_header(2000, 1000), {"Content-Type": "image/png"})
    assert over.status == 413 and "2000x1000" in over.json()["error"]
    garbage = client.call("POST", url, b"this is not an image at all", jpeg)
    assert garbage.status == 415 and "not an image" in garbage.json()["error"]
    truncated = client.call("POST", url, _encode("png")[:3000], {"Content-Type": "image/png"})
    assert truncated.status == 413 or truncated.status == 400  # astronaut is 512x512 < limit
    wrong_type = client.call("POST", url, b"abc", {"Content-Type": "text/plain"})
    assert wrong_type.status == 415
    assert client.call("POST", "/v1/infer?pipeline=nope", b"x", jpeg).status == 404
    assert client.call("POST", "/v1/infer", b"x", jpeg).status == 400
    assert client.call("POST", url, b"", jpeg).status == 400


# -- commands --------------------------------------------------------------------------------------
def test_commands(client: Client, pipeline: Any) -> None:
    r = client.post_json("/v1/commands/status", {})
    assert r.status == 200 and r.json()["ok"] is True
    assert r.json()["result"]["device_id"] == "web-test"
    try:
        r = client.post_json("/v1/commands/pause", {"pipeline": PIPELINE})
        assert r.json() == {"ok": True, "result": {"paused": [PIPELINE]}} and pipeline.paused
        # what the device and live pages show: paused, making no frames (not its old average)
        info = client.get("/v1/pipelines").json()[0]
        assert (info["state"], info["fps"], info["stats"]["fps"]) == ("paused", 0.0, 0.0), info
        assert info["stats"]["fps_overall"] > 0
    finally:
        r = client.post_json("/v1/commands/resume", {})
    assert r.status == 200 and not pipeline.paused
    assert client.get("/v1/pipelines").json()[0]["state"] == "running"
    bad = client.post_json("/v1/commands/pause", {"pipline": PIPELINE})
    assert bad.status == 400 and bad.json()["ok"] is False and "pipline" in bad.json()["error"]
    assert client.post_json("/v1/commands/explode", {}).status == 404
    text = client.call("POST", "/v1/commands/status", b"{}", {"Content-Type": "text/plain"})
    assert text.status == 415
    malformed = client.call("POST", "/v1/commands/status", b"{nope",
                            {"Content-Type": "application/json"})
    assert malformed.status == 400 and "malformed" in malformed.json()["error"]


# -- live view -------------------------------------------------------------------------------------
def _read_parts(conn: Any, n: int) -> list[tuple[float, bytes]]:
    response = conn.getresponse()
    assert response.status == 200
    ctype = response.headers["Content-Type"]
    boundary = re.search(r"boundary=(\S+)", ctype)
    assert ctype.startswith("multipart/x-mixed-replace") and boundary
    parts: list[tuple[float, bytes]] = []
    while len(parts) < n:
        line = response.readline()
        if not line.strip():
            continue
        assert line.strip() == f"--{boundary.group(1)}".encode()
        headers: dict[str, str] = {}
        while (h := response.readline().strip()):
            k, _, v = h.decode().partition(":")
            headers[k.lower()] = v.strip()
        assert headers["content-type"] == "image/jpeg"
        parts.append((time.monotonic(), response.read(int(headers["content-length"]))))
    return parts


def test_live_mjpeg(make_server: Any, client_of: Any, wait_for: Any) -> None:
    server = make_server(live_fps=4.0, max_viewers=1)
    client = client_of(server)
    time.sleep(0.6)
    assert server.stats()["frames_encoded"] == 0  # nobody watching: nothing encoded
    conn = client.connect()
    conn.request("GET", f"/v1/pipelines/{PIPELINE}/live.mjpg")
    parts = _read_parts(conn, 6)
    for _, jpeg in parts:
        assert _jpeg_size(jpeg) == (640, 480)
    rate = (len(parts) - 2) / (parts[-1][0] - parts[1][0])
    assert rate <= 4.0 * 1.15, f"{rate:.2f} frames/s to one viewer, limit 4"
    assert server.stats()["viewers"] == 1
    second = client.get(f"/v1/pipelines/{PIPELINE}/live.mjpg")
    assert second.status == 503 and "max_viewers" in second.json()["error"]
    assert client.get("/v1/pipelines/nope/live.mjpg").status == 404
    conn.close()
    wait_for(lambda: server.stats()["viewers"] == 0, 5, "the viewer leaving")
    time.sleep(0.6)  # the encoder notices
    encoded = server.stats()["frames_encoded"]
    time.sleep(1.0)
    assert server.stats()["frames_encoded"] == encoded  # idle again with no viewer


# -- events ----------------------------------------------------------------------------------------
def _events_with_clip(client: Client) -> list[dict[str, Any]]:
    events = client.get("/v1/events?limit=200").json()
    return [e for e in events if e["clip_url"] and e["snapshot_url"]]


def test_events_and_clip(client: Client, wait_for: Any) -> None:
    done = wait_for(lambda: _events_with_clip(client), 30, "an event with a clip")
    events = client.get("/v1/events?limit=200").json()
    assert [e["event_id"] for e in events]  # newest first within the pipeline
    ids = [int(e["event_id"].rsplit("-", 1)[1]) for e in events]
    assert ids == sorted(ids, reverse=True)
    assert len(client.get("/v1/events?limit=1").json()) == 1
    crosses = client.get("/v1/events?type=cross").json()
    assert crosses and all(e["type"] == "cross" for e in crosses)
    assert client.get("/v1/events?limit=0").status == 400
    assert client.get("/v1/events?limit=201").status == 400
    assert client.get("/v1/events?pipeline=nope").status == 404
    event = done[0]
    one = client.get(f"/v1/events/{event['event_id']}")
    assert one.status == 200 and one.json()["event_id"] == event["event_id"]
    assert client.get("/v1/events/no-such-event").status == 404
    snap = client.get(event["snapshot_url"])
    assert snap.status == 200 and _jpeg_size(snap.body) == (640, 480)
    clip = client.get(event["clip_url"])
    assert clip.status == 200 and clip.headers["Content-Type"] == "video/x-msvideo"
    assert clip.body[:4] == b"RIFF" and clip.headers["Accept-Ranges"] == "bytes"
    part = client.get(event["clip_url"], {"Range": "bytes=4-11"})
    assert part.status == 206 and part.body == clip.body[4:12]
    assert part.headers["Content-Range"] == f"bytes 4-11/{len(clip.body)}"


def test_clip_outside_the_media_folder_is_not_served(client: Client, pipeline: Any,
                                                     tmp_path: Path) -> None:
    secret = tmp_path / "secret.avi"
    secret.write_bytes(b"RIFF secret")
    event = {"event_id": "web-test-forged", "pipeline": PIPELINE, "type": "cross",
             "snapshot": str(secret), "clip": str(Path(pipeline.analytics.recorder._store
                                                       .directory) / ".." / ".." / "x.avi"),
             "clip_format": "mjpeg"}
    pipeline.analytics.recent.append(event)
    try:
        assert client.get("/v1/events/web-test-forged/clip").status == 404
        assert client.get("/v1/events/web-test-forged/snapshot.jpg").status == 404
        listed = client.get("/v1/events/web-test-forged").json()
        assert listed["clip_url"] is None and listed["snapshot_url"] is None
    finally:
        pipeline.analytics.recent.remove(event)


def test_an_event_without_its_snapshot_says_why(client: Client, pipeline: Any) -> None:
    """The recorder records on the event why its snapshot is missing (``EMFILE`` after its
    retries, say); the API answers with that reason, and pending is not 'not recorded'."""
    missing = {"event_id": "web-test-missing", "pipeline": PIPELINE, "type": "enter",
               "snapshot": None, "snapshot_pending": None,
               "snapshot_missing": "cannot write x.jpg: Too many open files (EMFILE, 6 tries)",
               "clip": None, "clip_format": None}
    pending = {**missing, "event_id": "web-test-pending", "snapshot_missing": None,
               "snapshot_pending": "/nowhere/x.jpg"}
    pipeline.analytics.recent.extend([missing, pending])
    try:
        r = client.get("/v1/events/web-test-missing/snapshot.jpg")
        assert r.status == 404 and "Too many open files (EMFILE" in r.json()["error"]
        listed = client.get("/v1/events/web-test-missing").json()
        assert listed["snapshot_url"] is None and "EMFILE" in listed["snapshot_missing"]
        r = client.get("/v1/events/web-test-pending/snapshot.jpg")
        assert r.status == 404 and "not written yet" in r.json()["error"]
    finally:
        pipeline.analytics.recent.remove(missing)
        pipeline.analytics.recent.remove(pending)


# -- the rest --------------------------------------------------------------------------------------
def test_openapi_describes_every_route(client: Client, server: Any) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    app = WebApp(server.config, server.host, None).build()  # type: ignore[arg-type]
    routes = {(r.method.lower(), re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", r.resource.canonical))
              for r in app.router.routes() if r.resource is not None and r.method != "HEAD"}
    described = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == described
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (method, path)
            names = set(re.findall(r"\{(\w+)\}", path))
            assert names <= {p["name"] for p in op.get("parameters", [])}, (method, path)


def test_pages_and_static(client: Client) -> None:
    from edgeinfer.web.app import STATIC_DIR

    r = client.get("/")
    assert r.status == (200 if (STATIC_DIR / "index.html").is_file() else 404)
    if r.status == 200:
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    assert client.get("/live/nope").status == 404
    assert client.get("/static/../../web/app.py").status == 404
    assert client.get("/static/%2e%2e/app.py").status == 404
    login = client.get("/login")  # no token: nothing to log in to (docs/web.md)
    assert login.status == 404 and b"no token" in login.body
    assert "frame-ancestors 'none'" in login.headers["Content-Security-Policy"]


def test_port_in_use_is_a_clear_error(server: Any, make_server: Any) -> None:
    port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
    with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is in use"):
        make_server(port=port)


def test_stop_ends_a_live_view(make_server: Any, client_of: Any) -> None:
    server = make_server()
    conn = client_of(server).connect()
    conn.request("GET", f"/v1/pipelines/{PIPELINE}/live.mjpg")
    _read_parts(conn, 1)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 3.0
    conn.close()
