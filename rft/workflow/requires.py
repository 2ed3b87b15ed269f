"""What a shipped workflow needs beyond rft's base install (an environment package, a Java
runtime), declared on the class as ``requires`` and checked at dry run and explorer start.

Data in: a workflow class's ``requires`` tuple. Data out: the unmet ones, each as a sentence
that says what to install. ``import rft`` imports none of these packages: the workflows import
them inside ``run``, and :func:`unmet` only looks them up (``importlib.util.find_spec``).
The pinned versions live in ``env/requirements-envs.txt`` (``bash env/setup.sh --envs``).
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass

SETUP_ENVS = "bash env/setup.sh --envs (installs env/requirements-envs.txt and a Java runtime)"


@dataclass(frozen=True)
class Requirement:
    """A Python module to import (``module``, installed as pip's ``package``) or a program on
    PATH (``program``, installed as ``install`` says)."""

    what: str  # for messages: "the Python package verifiers", "a Java runtime"
    install: str  # the command that installs it
    module: str = ""
    program: str = ""

    def met(self) -> bool:
        if self.module:
            try:
                return importlib.util.find_spec(self.module) is not None
            except (ImportError, ValueError):
                return False
        return shutil.which(self.program) is not None


def python_package(package: str, module: str = "") -> Requirement:
    """The pip package ``package`` (imported as ``module``, default the same name)."""
    return Requirement(
        what=f"the Python package {package}",
        install=f"pip install {package} (the pinned version: {SETUP_ENVS})",
        module=module or package.replace("-", "_"),
    )


JAVA = Requirement(
    what="a Java runtime (java on PATH)",
    install=f"apt-get install default-jre-headless, or {SETUP_ENVS}",
    program="java",
)


def unmet(cls: type) -> list[str]:
    """The requirements of workflow class ``cls`` that this machine lacks, as sentences."""
    return [f"{r.what}: {r.install}" for r in getattr(cls, "requires", ()) if not r.met()]
