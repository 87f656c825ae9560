"""Build hook (the rest of the metadata is in pyproject.toml): the kit's data directories stay at the
checkout root, where users read and edit them, and are copied whole into the wheel as `sparkdeploy/_data/<dir>`
so an installed `sparkdeploy` finds its templates, profiles, vocabs and the overlays source without a checkout
(see src/sparkdeploy/paths.py). An editable install reads the checkout itself and copies nothing.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA_DIRS = ("deploy", "images", "systemd", "vocabs", "overlays")
# What never enters an image build context or a template lookup (same rule as paths.tree_digest).
NOT_DATA = shutil.ignore_patterns("tests", "build", "dist", "__pycache__", "*.pyc", "*.egg-info", ".*")


class BuildPyWithKitData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for name in DATA_DIRS:
            target = Path(self.build_lib) / "sparkdeploy" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / name, target, ignore=NOT_DATA)


setup(cmdclass={"build_py": BuildPyWithKitData})
