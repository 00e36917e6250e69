"""The PEP 517 build backend of the ``rollgate`` package, written with the standard library only.

Why an in-tree backend: a trainer's environment is often offline, and a fresh ``python3 -m venv``
has pip and an old setuptools but no ``wheel``, so ``pip install --no-index --no-build-isolation``
cannot use setuptools' backend there. This one needs nothing but Python >= 3.9.

Hooks (PEP 517, PEP 660): ``build_wheel``, ``build_sdist``, ``build_editable``,
``prepare_metadata_for_build_wheel``, ``prepare_metadata_for_build_editable`` and the three
``get_requires_for_build_*`` (nothing is required). The package metadata is read from
``pyproject.toml``'s ``[project]`` table; the package is ``src/rollgate``.

Formats: wheels follow the binary distribution format (PEP 427 / PEP 491: ``.dist-info`` with
``METADATA``, ``WHEEL`` and a ``RECORD`` of urlsafe-base64 sha256 digests); metadata is Core
Metadata 2.1; sdists are ``<name>-<version>.tar.gz`` holding one ``<name>-<version>/`` folder with a
``PKG-INFO`` (PEP 517, PEP 625).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "rollgate"
SRC = os.path.join(ROOT, "src")
# Files and folders an sdist carries (beside PKG-INFO), relative to ROOT.
SDIST_ITEMS = ("pyproject.toml", "README.md", "_build", "src", "tests")
WHEEL_TAG = "py3-none-any"
# Reproducible archives: every entry gets this time (SOURCE_DATE_EPOCH overrides it).
DEFAULT_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can hold


# ── pyproject.toml ─────────────────────────────────────────────────────────────────────────────


def _parse_toml_subset(text: str) -> Dict[str, Any]:
    """Reads the TOML this project's pyproject.toml uses, for Pythons without ``tomllib`` (< 3.11).

    The subset: ``[table]`` and ``[dotted.table]`` headers, ``key = value`` where value is a
    basic string (with ``\\"``, ``\\\\``, ``\\n``, ``\\t`` escapes), a literal string, an integer,
    ``true``/``false``, or an array of strings that may span lines; ``#`` comments. Anything else is
    an error naming the line, never a silent guess.
    """
    data: Dict[str, Any] = {}
    table = data
    lines = text.splitlines()
    i = 0

    def fail(lineno: int, why: str) -> ValueError:
        return ValueError("pyproject.toml line %d: %s (the in-tree build backend reads a TOML subset)" % (lineno, why))

    def scalar(raw: str, lineno: int) -> Any:
        raw = raw.strip()
        if raw.startswith('"'):
            m = re.match(r'"((?:[^"\\]|\\.)*)"\s*(#.*)?$', raw)
            if not m:
                raise fail(lineno, "unterminated string")
            escapes = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
            out, k, s = [], 0, m.group(1)
            while k < len(s):
                if s[k] == "\\":
                    if k + 1 >= len(s) or s[k + 1] not in escapes:
                        raise fail(lineno, "unsupported escape")
                    out.append(escapes[s[k + 1]])
                    k += 2
                else:
                    out.append(s[k])
                    k += 1
            return "".join(out)
        if raw.startswith("'"):
            m = re.match(r"'([^']*)'\s*(#.*)?$", raw)
            if not m:
                raise fail(lineno, "unterminated literal string")
            return m.group(1)
        bare = raw.split("#", 1)[0].strip()
        if bare in ("true", "false"):
            return bare == "true"
        if re.fullmatch(r"[+-]?\d+", bare):
            return int(bare)
        raise fail(lineno, "unsupported value %r" % raw)

    def strip_comments(text: str) -> Tuple[str, bool]:
        """The text without ``#`` comments, and whether a ``]`` closes the array in it."""
        out, quote, k = [], "", 0
        while k < len(text):
            c = text[k]
            if quote:
                out.append(c)
                if c == "\\" and quote == '"' and k + 1 < len(text):
                    out.append(text[k + 1])
                    k += 1
                elif c == quote:
                    quote = ""
            elif c in "\"'":
                quote = c
                out.append(c)
            elif c == "#":
                while k < len(text) and text[k] != "\n":
                    k += 1
                continue
            elif c == "]":
                return "".join(out), True
            else:
                out.append(c)
            k += 1
        return "".join(out), False

    def array_items(body: str, lineno: int) -> List[Any]:
        items: List[Any] = []
        rest = body.strip()
        while rest:
            m = re.match(r'("(?:[^"\\]|\\.)*"|\'[^\']*\')\s*(,|$)', rest)
            if not m:
                raise fail(lineno, "arrays may hold strings only")
            items.append(scalar(m.group(1), lineno))
            rest = rest[m.end():].strip()
        return items

    while i < len(lines):
        lineno = i + 1
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]\s*(#.*)?", line)
        if header:
            table = data
            for part in header.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.fullmatch(r"([A-Za-z0-9_-]+)\s*=\s*(.+)", line)
        if not m:
            raise fail(lineno, "expected key = value")
        key, value = m.group(1), m.group(2).strip()
        if not value.startswith("["):
            table[key] = scalar(value, lineno)
            continue
        body, closed = strip_comments(value[1:])
        while not closed:
            if i >= len(lines):
                raise fail(lineno, "unterminated array")
            more, closed = strip_comments(lines[i])
            body += "\n" + more
            i += 1
        table[key] = array_items(body.replace("\n", " "), lineno)
    return data


def read_pyproject(path: Optional[str] = None) -> Dict[str, Any]:
    """The parsed pyproject.toml (``tomllib`` where Python has it, else the subset reader)."""
    with open(path or os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib  # type: ignore[import-not-found]  # Python >= 3.11
    except ImportError:
        return _parse_toml_subset(raw.decode("utf-8"))
    parsed: Dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
    return parsed


def _project() -> Mapping[str, Any]:
    project = read_pyproject().get("project")
    if not isinstance(project, dict) or not project.get("name") or not project.get("version"):
        raise ValueError("pyproject.toml needs a [project] table with name and version")
    return project


def _dist_name(project: Mapping[str, Any]) -> str:
    """The name as wheel and sdist file names spell it (PEP 427 / PEP 625 normalisation)."""
    return re.sub(r"[-_.]+", "_", str(project["name"])).lower()


def metadata_text(project: Mapping[str, Any]) -> str:
    """Core Metadata 2.1 (``METADATA`` / ``PKG-INFO``) from the ``[project]`` table."""
    lines = ["Metadata-Version: 2.1", "Name: %s" % project["name"], "Version: %s" % project["version"]]
    if project.get("description"):
        lines.append("Summary: %s" % project["description"])
    if project.get("requires-python"):
        lines.append("Requires-Python: %s" % project["requires-python"])
    if project.get("keywords"):
        lines.append("Keywords: %s" % ",".join(project["keywords"]))
    for classifier in project.get("classifiers", []):
        lines.append("Classifier: %s" % classifier)
    license_ = project.get("license")
    if isinstance(license_, str):
        lines.append("License-Expression: %s" % license_)
    body = ""
    readme = project.get("readme")
    if isinstance(readme, str):
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
        kind = "text/markdown" if readme.lower().endswith(".md") else "text/plain"
        lines.append("Description-Content-Type: %s; charset=UTF-8" % kind)
    return "\n".join(lines) + "\n\n" + body


def _wheel_text() -> str:
    return "Wheel-Version: 1.0\nGenerator: rollgate_build\nRoot-Is-Purelib: true\nTag: %s\n" % WHEEL_TAG


# ── archives ──────────────────────────────────────────────────────────────────────────────────


def _epoch() -> int:
    return max(DEFAULT_EPOCH, int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH)))


def _package_files() -> Iterator[Tuple[str, str]]:
    """(path inside the wheel, path on disk) of every file of the package, sorted, caches left out."""
    base = os.path.join(SRC, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(dirpath, name)
            yield os.path.relpath(full, SRC).replace(os.sep, "/"), full


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _write_wheel(directory: str, files: List[Tuple[str, bytes]], project: Mapping[str, Any]) -> str:
    name, version = _dist_name(project), str(project["version"])
    dist_info = "%s-%s.dist-info" % (name, version)
    entries = list(files)
    entries.append(("%s/METADATA" % dist_info, metadata_text(project).encode("utf-8")))
    entries.append(("%s/WHEEL" % dist_info, _wheel_text().encode("utf-8")))
    record_name = "%s/RECORD" % dist_info
    record = "".join(_record_line(a, d) + "\n" for a, d in entries) + "%s,,\n" % record_name
    entries.append((record_name, record.encode("utf-8")))
    filename = "%s-%s-%s.whl" % (name, version, WHEEL_TAG)
    stamp = time.gmtime(_epoch())[:6]
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in entries:
            info = zipfile.ZipInfo(arcname, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return filename


def _write_metadata_dir(directory: str, project: Mapping[str, Any]) -> str:
    dist_info = "%s-%s.dist-info" % (_dist_name(project), project["version"])
    path = os.path.join(directory, dist_info)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "METADATA"), "w", encoding="utf-8") as f:
        f.write(metadata_text(project))
    with open(os.path.join(path, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_text())
    return dist_info


# ── PEP 517 / PEP 660 hooks ───────────────────────────────────────────────────────────────────


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    return _write_metadata_dir(metadata_directory, _project())


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    return _write_metadata_dir(metadata_directory, _project())


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None, metadata_directory: Optional[str] = None) -> str:
    files = []
    for arcname, full in _package_files():
        with open(full, "rb") as f:
            files.append((arcname, f.read()))
    return _write_wheel(wheel_directory, files, _project())


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None, metadata_directory: Optional[str] = None) -> str:
    """A wheel whose only payload is a ``.pth`` file putting ``src`` on ``sys.path`` (PEP 660)."""
    project = _project()
    pth = ("__editable__.%s-%s.pth" % (_dist_name(project), project["version"]), (SRC + "\n").encode("utf-8"))
    return _write_wheel(wheel_directory, [pth], project)


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = _project()
    base = "%s-%s" % (_dist_name(project), project["version"])
    filename = base + ".tar.gz"
    epoch = _epoch()

    def add(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
        info = tarfile.TarInfo(arcname)
        info.size, info.mtime, info.mode = len(data), epoch, 0o644
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        add(tar, base + "/PKG-INFO", metadata_text(project).encode("utf-8"))
        for item in SDIST_ITEMS:
            full = os.path.join(ROOT, item)
            paths = [full] if os.path.isfile(full) else []
            for dirpath, dirnames, filenames in os.walk(full) if os.path.isdir(full) else []:
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                paths.extend(os.path.join(dirpath, n) for n in sorted(filenames) if not n.endswith((".pyc", ".pyo")))
            for path in paths:
                with open(path, "rb") as f:
                    add(tar, base + "/" + os.path.relpath(path, ROOT).replace(os.sep, "/"), f.read())
    return filename
