"""What a shipped workflow needs beyond the base install (rft.workflow.requires): unmet
requirements are named with what to install, at dry run; importing rft and every shipped
workflow module imports none of the environment packages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rft.errors import ConfigError
from rft.explorer.tasksets import WorkflowClass, check_requirements
from rft.workflow import Workflow
from rft.workflow.requires import JAVA, Requirement, python_package, unmet

ENV_PACKAGES = ("verifiers", "openenv", "agentscope", "scienceworld")


class _NeedsMissing(Workflow):
    requires = (
        python_package("rft-no-such-package"),
        Requirement(
            what="the program rft-no-such-program",
            install="apt-get install it",
            program="rft-no-such-program",
        ),
    )

    def run(self):
        return []


def test_unmet_names_each_missing_package_and_program_with_its_install_command():
    missing = unmet(_NeedsMissing)
    assert len(missing) == 2
    assert missing[0].startswith(
        "the Python package rft-no-such-package: pip install rft-no-such-package"
    )
    assert "bash env/setup.sh --envs" in missing[0]
    assert missing[1] == "the program rft-no-such-program: apt-get install it"


def test_met_requirements_are_not_listed():
    class Fine(Workflow):
        requires = (python_package("pyyaml", module="yaml"), python_package("numpy"))

    assert unmet(Fine) == []
    assert unmet(Workflow) == []


def test_java_is_looked_up_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not JAVA.met()
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert JAVA.met()


def test_check_requirements_refuses_the_taskset_naming_what_to_install():
    with pytest.raises(ConfigError) as e:
        check_requirements(WorkflowClass(_NeedsMissing), "buffer.explorer_input.taskset")
    message = str(e.value)
    assert message.startswith("buffer.explorer_input.taskset: workflow ")
    assert "_NeedsMissing needs the Python package rft-no-such-package" in message
    assert "; and the program rft-no-such-program" in message


def test_importing_rft_and_the_shipped_workflows_pulls_no_environment_package():
    code = (
        "import importlib, sys, rft, rft.workflow\n"
        "from rft.workflow.registry import SHIPPED_MODULES\n"
        "for m in SHIPPED_MODULES: importlib.import_module(m)\n"
        f"print(sorted(p for p in {ENV_PACKAGES!r} if p in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
