"""The web pages in a real browser (issue 16): Debian's ``chromium`` driven by Playwright loads
each page from ``edgeinfer run`` running as a real subprocess: real BlazeFace on a looping video
made from real photographs (``edgeinfer.testing.scene_video``: the astronaut's face crossing a
line and dwelling in a zone), with a token, so every page is reached through the login page.

Checked: the login refuses a wrong token and admits the right one; the device page lists the
pipeline with its fps and backend; the live image changes frame to frame and has a green box
where template matching finds the face; pause stops the frames (and the device page says
paused), resume restarts them; the snapshot button shows a snapshot; events appear with their
snapshot loaded and a clip that plays in ``<video>``. ``EDGEINFER_SCREENSHOTS=docs/img`` writes
the pages' screenshots there.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from webscene import scene_pipeline

from edgeinfer.testing.scene_video import SceneTruth

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "scene"
NOCAM = "door"  # an RTSP camera on a loopback port nothing listens on: refused, never opens
TOKEN = "browser-test-token-0123456789"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if CHROMIUM is None and not os.environ.get("CI"):
    pytest.skip("chromium is not installed (apt-get install chromium); CI fails instead",
                allow_module_level=True)
if not os.environ.get("CI"):
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(cond: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = cond()
        except (OSError, ValueError, KeyError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


class Daemon:
    """``edgeinfer run`` with an ``http:`` section, its URL and token."""

    def __init__(self, folder: Path, truth: SceneTruth, model: Path) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.cam_port = _free_port()
        config = {
            "device_id": "browser-test",
            "runtime": {"state_dir": str(folder / "state")},
            "http": {"port": int(self.url.rsplit(":", 1)[1]), "bind": "127.0.0.1",
                     "token": TOKEN, "live_fps": 10},
            "pipelines": [scene_pipeline(PIPELINE, truth, model, folder, "auto"), {
                "name": NOCAM,
                "source": {"type": "camera", "uri": f"rtsp://127.0.0.1:{self.cam_port}/live",
                           "open_timeout_s": 1, "reconnect": {"initial_s": 0.5, "max_s": 2}},
                "model": {"path": str(model), "threads": 1, "probe": False},
                "task": {"type": "detect", "decoder": "blazeface"},
                "sinks": [{"type": "jsonl", "path": str(folder / "door.jsonl")}]}],
        }
        path = folder / "config.json"
        path.write_text(json.dumps(config))
        self.stderr = folder / "stderr"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer", "run", "-c", str(path)], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=self.stderr.open("w"))

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path,
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def running(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited: {self.stderr.read_text()[-3000:]}")
        pipes = self.get("/v1/pipelines")
        return any(p["name"] == PIPELINE and p["fps"] > 0 for p in pipes)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def daemon(truth: SceneTruth, blazeface_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("daemon"), truth, blazeface_path)
    try:
        _until(d.running, "the pipeline running with fps > 0", timeout=60)
        yield d
    finally:
        d.stop()
    assert d.proc.returncode == 0, d.stderr.read_text()[-3000:]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.fail("CI is set and chromium is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _context(browser: Browser) -> BrowserContext:
    return browser.new_context(viewport={"width": 900, "height": 760})


def _login(page: Page, daemon: Daemon, token: str) -> None:
    page.goto(daemon.url + "/")
    page.wait_for_url("**/login")
    page.fill("#token", token)
    page.click("button[type=submit]")


@pytest.fixture(scope="module")
def context(browser: Browser, daemon: Daemon) -> Iterator[BrowserContext]:
    ctx = _context(browser)
    page = ctx.new_page()
    _login(page, daemon, TOKEN)
    page.wait_for_url(daemon.url + "/")
    page.close()
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    yield p
    p.close()
    assert not errors, f"script errors in the page: {errors}"


def _screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("EDGEINFER_SCREENSHOTS")
    if not folder:
        return
    from PIL import Image

    Path(folder).mkdir(parents=True, exist_ok=True)
    image = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")
    # A palette PNG, smaller until it fits: the docs keep each page under 200 KB.
    while True:
        out = io.BytesIO()
        image.quantize(colors=96).save(out, "PNG", optimize=True)
        if out.tell() < 200_000:
            break
        image = image.resize((image.width * 7 // 8, image.height * 7 // 8), Image.Resampling.LANCZOS)
    (Path(folder) / name).write_bytes(out.getvalue())


_GRAB = """(img) => { const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  c.getContext("2d").drawImage(img, 0, 0); return c.toDataURL("image/png"); }"""


def _frame(page: Page, selector: str = "#live") -> np.ndarray:
    """The image's current pixels at its own size (BGR)."""
    url = page.eval_on_selector(selector, _GRAB)
    data = np.frombuffer(base64.b64decode(url.split(",", 1)[1]), np.uint8)
    image = cv2.imdecode(data, cv2.IMREAD_COLOR)
    assert image is not None and image.size, "the live image could not be read"
    return image


def _changes(page: Page, seconds: float) -> float:
    """The largest mean absolute difference between the first frame and later ones."""
    first = _frame(page).astype(np.int16)
    most = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.15)
        most = max(most, float(np.abs(_frame(page).astype(np.int16) - first).mean()))
    return most


def _green_ring(frame: np.ndarray, truth: SceneTruth) -> tuple[float, float]:
    """(template match score, share of the face box's outline with green drawn on it): the
    face is found by matching the pasted crop, the box is what the daemon drew."""
    match = cv2.matchTemplate(frame, truth.patch, cv2.TM_CCOEFF_NORMED)
    _, score, _, (px, py) = cv2.minMaxLoc(match)
    fx1, fy1, fx2, fy2 = truth.face_in_patch
    x1, y1, x2, y2 = px + fx1, py + fy1, px + fx2, py + fy2
    b, g, r = (frame[..., i].astype(np.int16) for i in range(3))
    green = (g > 150) & (r < 110) & (b < 110)
    tol = int(0.2 * max(x2 - x1, y2 - y1)) + 3
    h, w = green.shape
    hits = []
    top, bottom, left, right = int(y1), int(y2), int(x1), int(x2)
    for col in range(left, right, 2):  # top and bottom edges
        for row in (top, bottom):
            rows = slice(max(0, row - tol), min(h, row + tol))
            hits.append(bool(green[rows, max(0, min(w - 1, col))].any()))
    for row in range(top, bottom, 2):  # left and right edges
        for col in (left, right):
            cols = slice(max(0, col - tol), min(w, col + tol))
            hits.append(bool(green[max(0, min(h - 1, row)), cols].any()))
    return float(score), sum(hits) / max(1, len(hits))


def test_a_wrong_token_is_refused_and_the_right_one_gets_in(browser: Browser,
                                                             daemon: Daemon) -> None:
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        _login(page, daemon, "not-the-token-0123456789")
        page.wait_for_selector("#error:not([hidden])")
        assert "wrong token" in page.inner_text("#error").lower()
        assert page.url.endswith("/login")
        status = page.evaluate("async () => (await fetch('/v1/status')).status")
        assert status == 401
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(daemon.url + "/")
        assert any(c["name"] == "edgeinfer_csrf" for c in ctx.cookies())
        assert page.evaluate("async () => (await fetch('/v1/status')).status") == 200
    finally:
        ctx.close()


def test_the_device_page_lists_the_pipeline_with_fps_and_backend(page: Page,
                                                                  daemon: Daemon) -> None:
    page.goto(daemon.url + "/")
    card = f"article[data-pipeline={PIPELINE}]"
    page.wait_for_selector(card)
    page.wait_for_function(f"() => parseFloat(document.querySelector('{card} [data-field=fps]')"
                           ".textContent) > 0", timeout=10_000)
    backend = page.inner_text(f"{card} [data-field=backend]")
    assert backend.strip() not in ("", "–"), backend
    assert page.inner_text(f"{card} [data-field=state]") == "running"
    assert "zone desk" in page.inner_text(card) and "line door" in page.inner_text(card)
    page.wait_for_function(f"() => parseInt(document.querySelector('{card} [data-field=events]')"
                           ".textContent) > 0", timeout=20_000)
    model = page.eval_on_selector(card, "c => [...c.querySelectorAll('dt')].find((d) => "
                                  "d.textContent === 'Model').nextElementSibling.textContent")
    assert model == "face_detection_short_range", model  # no version: no dangling "–"
    _screenshot(page, "web-device.png")


def test_a_camera_that_cannot_be_read_is_a_red_card_and_a_placeholder(page: Page,
                                                                      daemon: Daemon) -> None:
    page.goto(daemon.url + "/")
    card = f"article[data-pipeline={NOCAM}]"
    page.wait_for_selector(f"{card}.bad .badge.no_source")
    page.wait_for_function(f"() => / [0-9]+ retr/.test(document.querySelector("
                           f"'{card} [data-field=reason]').textContent)", timeout=20_000)
    reason = page.inner_text(f"{card} [data-field=reason]")
    assert reason.startswith(f"connection refused by 127.0.0.1:{daemon.cam_port}: is the camera"), \
        reason
    assert page.inner_text(f"{card} [data-field=state]") == "no source"
    assert page.inner_text(f"{card} [data-field=fps]") == "0"
    style = page.eval_on_selector(card, "c => [getComputedStyle(c).borderTopColor, "
                                  "getComputedStyle(c.querySelector('.badge')).backgroundColor]")
    assert style == ["rgb(198, 40, 40)", "rgb(198, 40, 40)"], style  # red, not green
    assert f"{NOCAM} no source" in page.inner_text("[data-field=not-running]")
    _screenshot(page, "web-device-no-camera.png")
    [door] = [p for p in daemon.get("/v1/pipelines") if p["name"] == NOCAM]
    assert door["state"] == door["health"]["state"] == "no_source" and door["fps"] == 0
    assert door["health"]["reason"] == reason.split(" · ")[0] and door["health"]["retries"] >= 1
    page.goto(f"{daemon.url}/live/{NOCAM}")
    page.wait_for_selector("#live-placeholder:not([hidden])")
    assert page.is_hidden("#live")  # no black box
    words = page.inner_text("#live-placeholder")
    assert "No picture: no source" in words and "connection refused by 127.0.0.1" in words, words
    assert page.inner_text("#state") == "no source"
    _screenshot(page, "web-live-no-camera.png")


def test_the_live_view_moves_and_boxes_the_face(page: Page, daemon: Daemon,
                                                truth: SceneTruth) -> None:
    page.goto(f"{daemon.url}/live/{PIPELINE}")
    page.wait_for_function("() => document.querySelector('#live').naturalWidth > 0", timeout=10_000)
    # 3 s: longer than the scene's stillest stretch (1.6 s held at the end + 0.4 s at the start)
    assert _changes(page, 3.0) > 1.0, "the live image did not change"
    best = (0.0, 0.0)
    for _ in range(10):  # the face is boxed in every frame; a few tries for a clean match
        frame = _frame(page)
        assert frame.shape[1::-1] == truth.size
        best = max(best, _green_ring(frame, truth), key=lambda s: s[1] if s[0] > 0.4 else 0)
        if best[0] > 0.4 and best[1] > 0.8:
            break
        time.sleep(0.1)
    print(f"live: face match {best[0]:.2f}, green on {best[1]:.0%} of its outline")
    assert best[0] > 0.4, f"the face is not in the live image (match {best[0]:.2f})"
    assert best[1] > 0.8, f"no green box around the face: {best[1]:.0%} of its outline"
    # the latency histogram has bars drawn, and a legend in words
    page.wait_for_function("""() => { const c = document.querySelector('#histogram');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 3; i < d.length; i += 4) if (d[i]) return true; return false; }""")
    legend = page.inner_text("#histogram-legend")
    assert "end to end (blue)" in legend and "_" not in legend, legend
    assert page.is_hidden("#live-placeholder")
    # an event with its snapshot loaded, and a clip that plays
    page.wait_for_function("() => [...document.querySelectorAll('#events img.thumb')]"
                           ".some((i) => i.complete && i.naturalWidth > 0)", timeout=20_000)
    page.wait_for_selector("#events video", timeout=20_000)
    _plays(page)
    _screenshot(page, "web-live.png")


def _plays(page: Page) -> None:
    played = page.evaluate("""async () => {
        const v = document.querySelector('#events video');
        v.muted = true; await v.play();
        const start = performance.now();
        while (v.currentTime < 0.3 && performance.now() - start < 8000)
            await new Promise((r) => setTimeout(r, 50));
        v.pause();
        return {t: v.currentTime, ready: v.readyState, error: v.error && v.error.message,
                w: v.videoWidth};
    }""")
    assert played["error"] is None, played
    assert played["t"] >= 0.3 and played["ready"] >= 2 and played["w"] > 0, played


def test_pause_stops_the_frames_and_resume_restarts_them(page: Page, context: BrowserContext,
                                                         daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/live/{PIPELINE}")
    page.wait_for_function("() => document.querySelector('#live').naturalWidth > 0", timeout=10_000)
    try:
        page.click("#pause")
        page.wait_for_function("() => document.querySelector('#state').textContent === 'paused'",
                               timeout=10_000)
        time.sleep(0.5)  # frames already on the way
        assert _changes(page, 1.2) < 0.01, "the live image changed while paused"
        device = context.new_page()
        device.goto(daemon.url + "/")
        device.wait_for_selector(f"article[data-pipeline={PIPELINE}] .badge.paused")
        fps = device.inner_text(f"article[data-pipeline={PIPELINE}] [data-field=fps]")
        assert fps == "0", f"a paused pipeline shows {fps} frames/s"
        device.close()
        assert page.inner_text("#fps") == "0 frames/s"
        page.click("#snapshot")
        page.wait_for_function("() => document.querySelector('#snapshot-img').naturalWidth > 0",
                               timeout=10_000)
        assert not page.is_hidden("#snapshot-box")
    finally:
        page.click("#resume")
    page.wait_for_function("() => document.querySelector('#state').textContent === 'running'",
                           timeout=10_000)
    assert _changes(page, 3.0) > 1.0, "the live image did not move again after resume"


def test_the_events_page_shows_events_with_snapshots_and_clips(page: Page,
                                                               daemon: Daemon) -> None:
    page.goto(daemon.url + "/events")
    page.wait_for_function("() => [...document.querySelectorAll('#events img.thumb')]"
                           ".filter((i) => i.complete && i.naturalWidth > 0).length >= 2",
                           timeout=20_000)
    page.wait_for_selector("#events video", timeout=20_000)
    text = page.inner_text("#events")
    assert "line door" in text or "zone desk" in text, text
    _plays(page)
    _screenshot(page, "web-events.png")


def test_an_event_without_a_snapshot_shows_why_on_the_events_page(browser: Browser,
                                                                   server: Any,
                                                                   pipeline: Any) -> None:
    """The events card showed nothing when an event had no snapshot; now it says why (the
    recorder puts the reason on the event: EMFILE after its retries, say)."""
    why = "cannot write x.jpg: Too many open files (EMFILE, 6 tries)"
    event = {"event_id": "web-test-no-snapshot", "pipeline": pipeline.name, "type": "enter",
             "zone": "desk", "track_id": 7, "label": "face", "start": time.time() + 3600,
             "snapshot": None, "snapshot_pending": None, "snapshot_missing": why,
             "clip": None, "clip_format": None, "clip_missing": None}
    pipeline.analytics.recent.append(event)
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url.rstrip("/") + "/events")
        card = page.wait_for_selector("li[data-event='web-test-no-snapshot'] .snapshot-missing",
                                      timeout=20_000)
        assert card is not None and card.inner_text() == f"No snapshot: {why}"
        assert not errors, errors
    finally:
        ctx.close()
        pipeline.analytics.recent.remove(event)
