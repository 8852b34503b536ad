# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""What pip install relies on: one version for the wheel and the package, and
an installed package finding the mok-compile installed with it. (.ci/run
installs the package and compiles a layer with it.)"""
import os
import re
import stat

import pytest

import mok
from mok import _compile

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_one_version_for_wheel_and_package():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["tool"]["scikit-build"]["metadata"]["version"]
    assert version["provider"] == "scikit_build_core.metadata.regex"
    with open(os.path.join(ROOT, version["input"])) as f:
        # scikit-build-core's default pattern for a __version__ assignment
        m = re.search(r'(?m)^__version__ *= *([\'"])v?(?P<value>.+?)\1', f.read())
    assert m and m.group("value") == mok.__version__ == _compile.__version__


def _fake_paths(site, scripts):
    return {"purelib": str(site), "platlib": str(site), "scripts": str(scripts)}


@pytest.mark.parametrize("scheme", ["default", "user"])
def test_installed_package_finds_its_scripts_folder(scheme, tmp_path, monkeypatch):
    package_parent = os.path.join(os.path.dirname(mok.__file__), "..")
    real = _compile.sysconfig.get_paths

    def get_paths(scheme_name=None, **kwargs):
        name = kwargs.get("scheme", scheme_name)
        if (name is None) == (scheme == "default"):
            return _fake_paths(package_parent, tmp_path / scheme)
        return _fake_paths(tmp_path / "elsewhere", tmp_path / "other-scripts")
    monkeypatch.setattr(_compile.sysconfig, "get_paths", get_paths)
    assert _compile._installed_scripts_dir() == str(tmp_path / scheme)
    monkeypatch.setattr(_compile.sysconfig, "get_paths",
                        lambda **kw: _fake_paths(tmp_path / "elsewhere", tmp_path))
    assert _compile._installed_scripts_dir() == ""
    monkeypatch.setattr(_compile.sysconfig, "get_paths", real)


def test_find_compiler_prefers_the_installed_one_to_path(tmp_path, monkeypatch):
    """Outside a build tree, the mok-compile beside the installed package
    comes before one on PATH (another installation's)."""
    scripts, on_path = tmp_path / "scripts", tmp_path / "path"
    for d in (scripts, on_path):
        d.mkdir()
        tool = d / "mok-compile"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.delenv("MOK_COMPILER", raising=False)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setattr(_compile, "__file__", str(tmp_path / "site" / "mok" / "_compile.py"))
    monkeypatch.setattr(_compile, "_installed_scripts_dir", lambda: str(scripts))
    assert _compile._find_compiler() == str(scripts / "mok-compile")
    monkeypatch.setattr(_compile, "_installed_scripts_dir", lambda: "")
    assert _compile._find_compiler() == str(on_path / "mok-compile")
    monkeypatch.setenv("MOK_COMPILER", str(scripts / "mok-compile"))
    assert _compile._find_compiler() == str(scripts / "mok-compile")
