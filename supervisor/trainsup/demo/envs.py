"""Owns the demo's trainer environments: a venv whose safetensors is too old for float8.

The venv must see the project and everything else exactly as the current environment has them
(a system interpreter, a venv, pipx), with only safetensors pinned back. ``--system-site-packages``
is not that: from inside a venv it exposes the *base* interpreter's packages, not the venv's. So the
new venv gets a ``.pth`` file that adds the current environment's site directories after its own
(``site.addsitedir``, so their ``.pth`` files, an editable install's among them, are honoured too).
"""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path

OLD_SAFETENSORS = "0.4.1"


def current_site_dirs() -> list[str]:
    """The site directories this interpreter imports from, in its order."""
    dirs = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    for extra in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]):
        if extra not in dirs:
            dirs.append(extra)
    if site.ENABLE_USER_SITE and site.getusersitepackages() not in dirs:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if Path(d).is_dir()]


def make_venv_seeing_this_environment(venv: Path) -> Path:
    """A new venv at ``venv`` that imports its own packages first, then this environment's; returns
    its python. Raises CalledProcessError or OSError when the venv cannot be made."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in current_site_dirs())
    (Path(own) / "zz-trainsup-outer-env.pth").write_text(lines, encoding="utf-8")
    return python


def old_safetensors_venv(venv: Path) -> Path:
    """A venv seeing this environment, with safetensors 0.4.1 (from the package registry) in front."""
    python = make_venv_seeing_this_environment(venv)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"safetensors=={OLD_SAFETENSORS}"], check=True, capture_output=True, timeout=600)
    return python
