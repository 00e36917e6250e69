"""The in-tree build backend: wheel, sdist and editable wheel as the specs lay them out, and the
offline install a trainer does (``pip install --no-index --no-build-isolation``) into a fresh
venv, with the hooks this machine's pip really calls."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(PROJECT, "_build"))

import rollgate_build  # noqa: E402


def package_modules():
    base = os.path.join(PROJECT, "src", "rollgate")
    return sorted("rollgate/" + n for n in os.listdir(base) if n.endswith(".py") or n == "py.typed")


class BackendTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rollgate-build-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_pyproject_subset_reader_agrees_with_tomllib(self):
        with open(os.path.join(PROJECT, "pyproject.toml"), encoding="utf-8") as f:
            text = f.read()
        subset = rollgate_build._parse_toml_subset(text)
        self.assertEqual(subset["build-system"], {"requires": [], "build-backend": "rollgate_build", "backend-path": ["_build"]})
        self.assertEqual(subset["project"]["requires-python"], ">=3.9")
        try:
            import tomllib
        except ImportError:
            self.skipTest("Python < 3.11 has no tomllib to compare with; the subset reader was checked above")
        self.assertEqual(subset, tomllib.loads(text))
        self.assertEqual(rollgate_build._parse_toml_subset('a = "x # not a comment" # comment\nb = [\n  "1", # one\n  \'2\',\n]\nc = true\n'), {"a": "x # not a comment", "b": ["1", "2"], "c": True})
        with self.assertRaises(ValueError):
            rollgate_build._parse_toml_subset("x = {inline = 1}\n")

    def test_version_is_the_packages(self):
        import rollgate

        self.assertEqual(rollgate_build.read_pyproject()["project"]["version"], rollgate.__version__)

    def test_wheel_layout_metadata_and_record(self):
        name = rollgate_build.build_wheel(self.tmp)
        self.assertEqual(name, "rollgate-0.1.0-py3-none-any.whl")
        with zipfile.ZipFile(os.path.join(self.tmp, name)) as zf:
            names = zf.namelist()
            self.assertEqual(sorted(n for n in names if n.startswith("rollgate/")), package_modules())
            self.assertFalse([n for n in names if "__pycache__" in n or n.endswith(".pyc")])
            meta = zf.read("rollgate-0.1.0.dist-info/METADATA").decode()
            self.assertIn("Metadata-Version: 2.1\nName: rollgate\nVersion: 0.1.0\n", meta)
            self.assertIn("Requires-Python: >=3.9\n", meta)
            self.assertIn("Description-Content-Type: text/markdown", meta)
            self.assertIn("# rollgate (Python)", meta)
            self.assertIn("Tag: py3-none-any", zf.read("rollgate-0.1.0.dist-info/WHEEL").decode())
            record = zf.read("rollgate-0.1.0.dist-info/RECORD").decode().splitlines()
            self.assertEqual(len(record), len(names))
            for line in record:
                path, digest, size = line.rsplit(",", 2)
                if path.endswith("RECORD"):
                    self.assertEqual((digest, size), ("", ""))
                    continue
                data = zf.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((digest, int(size)), ("sha256=" + want, len(data)), path)
        # Reproducible: the same sources give the same bytes.
        again = tempfile.mkdtemp(dir=self.tmp)
        rollgate_build.build_wheel(again)
        with open(os.path.join(self.tmp, name), "rb") as a, open(os.path.join(again, name), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_sdist_and_editable_wheel(self):
        name = rollgate_build.build_sdist(self.tmp)
        self.assertEqual(name, "rollgate-0.1.0.tar.gz")
        with tarfile.open(os.path.join(self.tmp, name)) as tar:
            members = tar.getnames()
        for want in ("PKG-INFO", "pyproject.toml", "README.md", "_build/rollgate_build.py", "src/rollgate/__init__.py", "src/rollgate/py.typed", "tests/test_build.py"):
            self.assertIn("rollgate-0.1.0/" + want, members)
        editable = rollgate_build.build_editable(self.tmp)
        with zipfile.ZipFile(os.path.join(self.tmp, editable)) as zf:
            self.assertEqual(zf.read("__editable__.rollgate-0.1.0.pth").decode().strip(), os.path.join(PROJECT, "src"))
        meta_dir = rollgate_build.prepare_metadata_for_build_wheel(self.tmp)
        self.assertEqual(meta_dir, "rollgate-0.1.0.dist-info")
        self.assertTrue(os.path.exists(os.path.join(self.tmp, meta_dir, "METADATA")))
        self.assertEqual(rollgate_build.get_requires_for_build_wheel(), [])

    def test_offline_install_into_a_fresh_venv_with_the_hooks_pip_calls(self):
        # A copy of the project whose backend logs each hook pip calls, then delegates.
        src = os.path.join(self.tmp, "project")
        shutil.copytree(PROJECT, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        trace = os.path.join(self.tmp, "hooks.log")
        with open(os.path.join(src, "_build", "traced_backend.py"), "w") as f:
            f.write(
                "import rollgate_build as _b\n"
                "def _wrap(name):\n"
                "    def hook(*a, **k):\n"
                "        with open(%r, 'a') as log: log.write(name + '\\n')\n"
                "        return getattr(_b, name)(*a, **k)\n"
                "    return hook\n"
                "for _n in [n for n in dir(_b) if n.startswith(('build_', 'get_requires_', 'prepare_metadata_'))]:\n"
                "    globals()[_n] = _wrap(_n)\n" % trace
            )
        pyproject = os.path.join(src, "pyproject.toml")
        with open(pyproject) as f:
            text = f.read().replace('build-backend = "rollgate_build"', 'build-backend = "traced_backend"')
        with open(pyproject, "w") as f:
            f.write(text)
        venv = os.path.join(self.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
        env.pop("PYTHONPATH", None)
        pip = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", src], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)
        with open(trace) as f:
            hooks = f.read().split()
        self.assertIn("build_wheel", hooks)
        self.assertTrue(set(hooks) <= {"get_requires_for_build_wheel", "prepare_metadata_for_build_wheel", "build_wheel"}, hooks)
        shown = subprocess.run([py, "-c", "import json, rollgate, rollgate.grpo; print(json.dumps([rollgate.__version__, rollgate.__file__]))"], env=env, capture_output=True, text=True, cwd=self.tmp)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        version, where = json.loads(shown.stdout)
        self.assertEqual(version, "0.1.0")
        self.assertTrue(where.startswith(venv), where)
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(where), "py.typed")))


if __name__ == "__main__":
    unittest.main()
