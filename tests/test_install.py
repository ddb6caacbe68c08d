"""scripts/install.sh against a temporary DESTDIR, and the unit it installs: `systemd-analyze
verify` against that tree and `systemd-analyze security --offline=true` scored <= 2.5.

The install is offline and quick: pip installs only edgeinfer itself (EDGEINFER_PIP_ARGS=--no-deps)
and the venv finds the dependencies where this interpreter has them. With --system-site-packages
that is enough when the tests run on the system's Python; when they run in a virtual environment
(the README's way), a new venv's "system" is the base interpreter, which lacks them, so
`with_deps_of_this_python` makes the venv first and adds this interpreter's site-packages to it."""

from __future__ import annotations

import os
import re
import shutil
import site
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install.sh"
UNIT = ROOT / "systemd" / "edgeinfer.service"
PREFIX = "/opt/edgeinfer"

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed")


def with_deps_of_this_python(destdir: Path, prefix: str = PREFIX) -> None:
    """Make the venv install.sh will reuse, seeing this interpreter's packages after its own."""
    if sys.prefix == sys.base_prefix:
        return  # the system's Python: --system-site-packages already shows its packages
    venv = destdir / prefix.strip("/") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180)
    purelib = subprocess.run([str(venv / "bin/python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # Plain directory lines: appended to sys.path after the venv's own site-packages, so the
    # edgeinfer installed there wins, and this venv's editable edgeinfer (a .pth hook) is not seen.
    (Path(purelib) / "_edgeinfer_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def install(destdir: Path, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    bindir = str(Path(sys.executable).parent)
    full_env = {**os.environ, "DESTDIR": str(destdir), "PYTHON": sys.executable,
                "EDGEINFER_PIP_ARGS": "--no-deps", "PATH": bindir + os.pathsep + os.environ["PATH"],
                "EDGEINFER_INSTALL_MODEL_FILE": str(destdir / "no-device-tree-model"), **env}
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=full_env, capture_output=True,
                          text=True, timeout=180, cwd=destdir)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("destdir")
    with_deps_of_this_python(dest)
    install(dest, "--prefix", PREFIX, "--no-enable", "--system-site-packages")
    return dest


def security_score(unit: Path) -> tuple[float, str]:
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1)), proc.stdout


def verify_root(dest: Path) -> Path:
    """A root for `systemd-analyze verify --root=`: the installed unit, the host's system units
    (targets it orders against), /bin/kill for ExecReload, and a stub ExecStart binary where
    the venv would be on the device (a venv is not relocatable, so its real path is in dest)."""
    root = dest.parent / (dest.name + "-verify")
    shutil.rmtree(root, ignore_errors=True)
    for sub in ("etc/systemd/system", "bin", "usr/lib/systemd"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(dest / "etc/systemd/system/edgeinfer.service", root / "etc/systemd/system")
    dropins = dest / "etc/systemd/system/edgeinfer.service.d"
    if dropins.is_dir():  # the port drop-in is verified with the unit
        shutil.copytree(dropins, root / "etc/systemd/system/edgeinfer.service.d")
    host_units = Path("/lib/systemd/system")
    if host_units.is_dir():
        shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
    shutil.copy("/bin/kill", root / "bin/kill")
    stub = root / PREFIX.lstrip("/") / "venv/bin/edgeinfer"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    return root


def analyze_verify(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", "edgeinfer.service"],
                          capture_output=True, text=True, timeout=60)


def test_install_leaves_venv_config_credentials_and_unit(installed: Path) -> None:
    venv = installed / PREFIX.lstrip("/") / "venv"
    entry = venv / "bin" / "edgeinfer"
    assert entry.is_file() and os.access(entry, os.X_OK)
    help_run = subprocess.run([str(entry), "--help"], capture_output=True, text=True, timeout=60,
                              cwd=installed)
    assert help_run.returncode == 0 and "usage: edgeinfer" in help_run.stdout
    # The venv holds its own copy of the package, not the source tree.
    where = subprocess.run([str(venv / "bin/python"), "-c", "import edgeinfer; print(edgeinfer.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=installed)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr

    config = installed / "etc/edgeinfer/config.yaml"
    assert config.read_text() == (ROOT / "configs/camera-detect.yaml").read_text()
    check = subprocess.run([str(entry), "validate-config", str(config)], capture_output=True,
                           text=True, timeout=60, cwd=installed)
    assert check.returncode == 0, check.stderr
    creds = installed / "etc/edgeinfer/credentials"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o700
    assert stat.S_IMODE((creds / "mqtt_password").stat().st_mode) == 0o600

    unit = (installed / "etc/systemd/system/edgeinfer.service").read_text()
    assert f"\nExecStart={PREFIX}/venv/bin/edgeinfer run -c /etc/edgeinfer/config.yaml\n" in unit
    assert unit.replace(f"ExecStart={PREFIX}/", "ExecStart=/opt/edgeinfer/") == UNIT.read_text()
    # camera-detect.yaml listens on no port: the service may bind none.
    dropin = (installed / "etc/systemd/system/edgeinfer.service.d/50-listen.conf").read_text()
    assert "\nSocketBindDeny=any\n" in dropin and "SocketBindAllow" not in dropin


def test_second_run_is_idempotent_and_keeps_a_changed_config(installed: Path) -> None:
    config = installed / "etc/edgeinfer/config.yaml"
    config.write_text(config.read_text() + "# mine\n")
    creds = installed / "etc/edgeinfer/credentials"
    (creds / "mqtt_password").write_text("s3cret\n")
    creds.chmod(0o755)  # repaired by the second run
    proc = install(installed, "--prefix", PREFIX, "--no-enable", "--system-site-packages")
    assert "reusing the virtual environment" in proc.stdout
    assert "keeping the existing /etc/edgeinfer/config.yaml" in proc.stdout
    assert config.read_text().endswith("# mine\n")
    assert (creds / "mqtt_password").read_text() == "s3cret\n"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o700
    venv = installed / PREFIX.lstrip("/") / "venv"
    assert subprocess.run([str(venv / "bin/edgeinfer"), "--help"], capture_output=True,
                          timeout=60).returncode == 0


@needs_analyze
def test_installed_unit_passes_systemd_analyze_verify(installed: Path) -> None:
    root = verify_root(installed)
    proc = analyze_verify(root)
    assert proc.returncode == 0, proc.stderr
    # verify warns about unknown keys and bad values but still exits 0: no output is the bar.
    assert proc.stderr.strip() == "" and proc.stdout.strip() == "", proc.stderr + proc.stdout
    # And it does look at the tree: without the ExecStart binary it fails.
    (root / PREFIX.lstrip("/") / "venv/bin/edgeinfer").unlink()
    missing = analyze_verify(root)
    assert missing.returncode != 0 and "is not executable" in missing.stderr


@needs_analyze
def test_unit_security_exposure_is_at_most_2_5(installed: Path) -> None:
    score, report = security_score(installed / "etc/systemd/system/edgeinfer.service")
    assert score <= 2.5, report
    assert score == security_score(UNIT)[0]


def test_prefix_is_substituted_in_exec_start_only(tmp_path: Path) -> None:
    with_deps_of_this_python(tmp_path, "/srv/ei/")
    install(tmp_path, "--prefix", "/srv/ei/", "--no-enable", "--system-site-packages")
    unit = (tmp_path / "etc/systemd/system/edgeinfer.service").read_text()
    assert "\nExecStart=/srv/ei/venv/bin/edgeinfer run -c /etc/edgeinfer/config.yaml\n" in unit
    assert (tmp_path / "srv/ei/venv/bin/edgeinfer").is_file()
    assert not (tmp_path / "opt").exists()


def test_uninstall_keeps_config_and_purge_removes_it(installed: Path, tmp_path: Path) -> None:
    dest = tmp_path / "root"
    shutil.copytree(installed / "etc", dest / "etc", symlinks=True)
    (dest / "opt/edgeinfer/venv/bin").mkdir(parents=True)  # uninstall removes whatever is there
    (dest / "var/lib/edgeinfer").mkdir(parents=True)
    (dest / "var/lib/edgeinfer/outbox.sqlite3").write_text("")
    install(dest, "--uninstall")
    assert not (dest / "etc/systemd/system/edgeinfer.service").exists()
    assert not (dest / "opt/edgeinfer").exists()
    assert (dest / "etc/edgeinfer/config.yaml").is_file()
    assert (dest / "etc/edgeinfer/credentials").is_dir()
    assert (dest / "var/lib/edgeinfer/outbox.sqlite3").exists()
    install(dest, "--uninstall")  # again: nothing left to remove is fine
    install(dest, "--uninstall", "--purge")
    assert not (dest / "etc/edgeinfer").exists() and not (dest / "var/lib/edgeinfer").exists()


def test_32_bit_arm_is_refused_with_the_reason(tmp_path: Path) -> None:
    proc = install(tmp_path, "--no-enable", check=False, EDGEINFER_INSTALL_MACHINE="armv7l")
    assert proc.returncode == 1
    assert "32-bit ARM" in proc.stderr and "no 32-bit ARM wheels" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_raspberry_pi_gets_system_site_packages_and_the_pi_config(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.write_bytes(b"Raspberry Pi 4 Model B Rev 1.5\0")
    dest = tmp_path / "root"
    dest.mkdir()
    # No --system-site-packages here: the Pi turns it on.
    with_deps_of_this_python(dest)
    install(dest, "--no-enable", EDGEINFER_INSTALL_MODEL_FILE=str(model))
    cfg = (dest / "opt/edgeinfer/venv/pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg
    assert (dest / "etc/edgeinfer/config.yaml").read_text() == (ROOT / "configs/pi4.yaml").read_text()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    assert install(tmp_path, "--bogus", check=False).returncode == 1
    assert install(tmp_path, "--prefix", "relative", check=False).returncode == 1
    assert install(tmp_path, "--purge", check=False).returncode == 1
    assert "--prefix DIR" in install(tmp_path, "--help").stdout
