"""What a plain ``pip install`` gives a user, proven in a throwaway virtual environment.

- ``pyproject.toml`` lists every package folder (configs/ ships inside the wheel);
- docs/install.md has a row for every third-party package the code imports, and its "comes
  with" column agrees with pyproject.toml;
- (slow) a fresh venv with only the CPU torch and ``pip install .``, none of the extras: every
  command with its defaults runs without a traceback; a tracker or figure package that is missing
  is one line before anything is written.

The bare venv installs ``$TORCH_SPEC`` (what the Makefile installs; default ``torch==2.13.0``,
the CPU build this project's CI uses) and reuses pip's cache. ``CRITIC_PRETRAIN_SKIP_BARE_INSTALL=1``
skips it on machines where pip cannot reach a package index.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OWN = {"critic_pretrain", "rollouts"}
OPTIONAL = ("wandb", "mlflow", "nbclient", "nbformat", "ipykernel", "pytest", "pytest-xdist", "trl", "hypothesis",
            "comet-ml")
"""Distributions the bare install must not have: the extras and the test tools."""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(reqs: list[str]) -> set[str]:
    """Distribution names of requirement strings; ``critic-pretrain[x]`` expands extra ``x``."""
    out = set()
    for req in reqs:
        name, extras = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req).groups()
        if norm(name) == "critic-pretrain":
            for extra in (extras or "").split(","):
                out |= requirement_names(PYPROJECT["project"]["optional-dependencies"][extra.strip()])
        else:
            out.add(norm(name))
    return out


# ---------------------------------------------------------------------------------------------
# Packaging and the table of imports (fast)

def test_pyproject_lists_every_package_folder():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in OWN for p in (ROOT / top).rglob("__init__.py")}
    assert found <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert all((ROOT / mapped.get(p, p.replace(".", "/"))).is_dir() for p in listed)


def code_imports() -> dict[str, set[str]]:
    """Top-level third-party modules the package code imports (``import``, ``from``, and the
    lazy ``require("x", ...)``), with the files that import them."""
    found: dict[str, set[str]] = {}
    for top in OWN:
        for f in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require" and node.args
                      and isinstance(node.args[0], ast.Constant)):
                    names = [node.args[0].value]
                for name in names:
                    top_name = name.partition(".")[0]
                    if top_name not in sys.stdlib_module_names and top_name not in OWN:
                        found.setdefault(top_name, set()).add(str(f.relative_to(ROOT)))
    return found


def install_table() -> list[dict]:
    """Rows of docs/install.md's "Every package the code imports" table."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text.split("## Every package the code imports", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        rows.append({"imports": re.findall(r"`([^`]+)`", cells[0]),
                     "packages": [norm(p) for p in re.split(r",\s*", cells[1]) if p and p != "..."],
                     "comes_with": cells[2]})
    return rows


def test_every_import_has_a_row_in_docs_install_md():
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    rows = install_table()
    documented = {name for row in rows for name in row["imports"]}
    trackers = set(LOGGER_TYPE_TO_CLASS)  # accelerate imports the tracker we name in train.report_to
    missing = {m: sorted(fs) for m, fs in code_imports().items() if m not in documented}
    assert not missing, f"document these imports in docs/install.md: {missing}"
    assert trackers <= documented, f"document these trackers in docs/install.md: {sorted(trackers - documented)}"


def test_install_table_agrees_with_pyproject():
    core = requirement_names(PYPROJECT["project"]["dependencies"])
    extras = {k: requirement_names(v) for k, v in PYPROJECT["project"]["optional-dependencies"].items()}
    everything = core.union(*extras.values())
    for row in install_table():
        where = f"docs/install.md row {row['imports']}"
        how, _, via = row["comes_with"].partition(", via ")
        how = how.strip("`")
        if how == "core":
            need = {norm(via)} if via else set(row["packages"])
            assert need <= core, f"{where}: not a dependency in pyproject.toml: {need - core}"
        elif how in extras:
            need = {norm(via)} if via else set(row["packages"])
            assert need <= extras[how], f"{where}: not in the {how} extra: {need - extras[how]}"
        else:
            assert how == "your own install", f"{where}: unknown 'comes with' {row['comes_with']!r}"
            assert not set(row["packages"]) & everything, f"{where}: pyproject.toml does install it"


# ---------------------------------------------------------------------------------------------
# The bare install (slow: builds a venv, a few minutes on 2 cores)

def _copy_checkout(dst: Path) -> Path:
    """The working tree as it is (uncommitted changes included), without build outputs."""
    skip = shutil.ignore_patterns(".git", ".venv*", "runs", "build", "dist", "*.egg-info", "__pycache__",
                                  ".pytest_cache", ".hypothesis", "out", "seeds")
    shutil.copytree(ROOT, dst, ignore=skip)
    return dst


class Bare:
    """A venv holding the CPU torch and ``pip install .``; runs commands in a work folder."""

    def __init__(self, root: Path):
        self.venv, self.work = root / "venv", root / "work"
        self.work.mkdir()
        self.bin = self.venv / "bin"

    def pip(self, *args: str) -> None:
        subprocess.run([str(self.bin / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                       check=True, timeout=900)

    def installed(self) -> set[str]:
        out = subprocess.run([str(self.bin / "python"), "-m", "pip", "list", "--format=json"],
                             check=True, capture_output=True, text=True).stdout
        return {norm(d["name"]) for d in json.loads(out)}

    def run(self, *args: str, rc: int = 0) -> str:
        """``critic-pretrain ARGS`` in the work folder; its exit code must be ``rc``; never a traceback."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["HF_HUB_OFFLINE"] = "1"
        proc = subprocess.run([str(self.bin / "critic-pretrain"), *args], cwd=self.work, env=env,
                              capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == rc and "Traceback" not in out, f"critic-pretrain {' '.join(args)}: " \
            f"exit {proc.returncode} (want {rc})\n{out[-3000:]}"
        return out

    def refuses(self, *args: str, says: str) -> str:
        """Exit 2 with exactly one ``error:`` line that contains ``says``."""
        out = self.run(*args, rc=2)
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and says in errors[0], out[-2000:]
        return errors[0]


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Bare:
    if os.environ.get("CRITIC_PRETRAIN_SKIP_BARE_INSTALL") == "1":
        pytest.skip("CRITIC_PRETRAIN_SKIP_BARE_INSTALL=1")
    root = tmp_path_factory.mktemp("bare")
    env = Bare(root)
    subprocess.run([sys.executable, "-m", "venv", str(env.venv)], check=True)
    torch_spec = os.environ.get("TORCH_SPEC", "torch==2.13.0")
    if torch_spec:
        env.pip("install", torch_spec)
    env.pip("install", str(_copy_checkout(root / "src")))  # a wheel, not editable: what PyPI users get
    return env


TINY = ["train.max_steps=4", "checkpoint.save_every=2", "eval.every=2", "train.log_every=2"]


@pytest.mark.slow
def test_bare_install_runs_every_default(bare):
    leaked = {norm(d) for d in OPTIONAL} & bare.installed()
    assert not leaked, f"the bare install pulled optional packages: {sorted(leaked)}"
    w = bare.work

    # train with defaults (TensorBoard included) through the bundled demo config; the seed check ends it
    out = bare.run("demo", "output_dir=run", *TINY)
    assert "is a valid critic seed for nemo-rl" in out
    assert list((w / "run" / "tensorboard").rglob("events.*")) and (w / "run" / "step_4").is_dir()
    bare.run("train", "--config", "configs/demo.yaml", "output_dir=run", *TINY)  # re-run: resumes, done
    bare.run("eval", "run/step_4")
    bare.run("report", "run")
    assert {p.name for p in (w / "run" / "report").iterdir()} >= {"report.md", "loss.png", "explained_variance.png"}
    bare.run("seed", "check", "run/step_4")
    for fmt in ("hf", "openrlhf", "trl", "nemo-rl"):
        bare.run("export", "run/step_4", "--format", fmt, "--out", f"seeds/{fmt}")
        assert (w / "seeds" / fmt).is_dir()
    bare.run("plan", "--config", "demo")
    bare.run("bench", "--shape", "tiny", "--steps", "2", "--warmup", "1")
    (w / "jobs.yaml").write_text("jobs:\n  - name: one\n    config: demo\n    overrides:\n"
                                 + "".join(f"      - {o}\n" for o in ["output_dir=batch_run", *TINY]))
    bare.run("batch", "jobs.yaml")
    assert (w / "batch_run" / "step_4").is_dir()

    # the rollouts commands
    bare.run("rollouts", "check", "builtin:sample")
    bare.run("rollouts", "schema")
    bare.run("rollouts", "synth", "--rows", "40", "--out", "synth")
    (w / "dump.jsonl").write_text(json.dumps({"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1],
                                              "reward": 1.0}) + "\n")
    bare.run("rollouts", "convert", "--from", "generic", "dump.jsonl", "--out", "converted")
    assert list((w / "converted").glob("*.parquet"))


@pytest.mark.slow
def test_bare_install_missing_packages_are_one_line(bare):
    """Requested extras that are not installed, and core packages removed from the venv: one
    line before anything is written (the output folder stays absent)."""
    for tracker in ("wandb", "mlflow", "comet_ml"):
        bare.refuses("demo", f"output_dir=t_{tracker}", f"train.report_to=[{tracker}]",
                     says=f"train.report_to has {tracker} but its package is not installed: pip install")
        assert not (bare.work / f"t_{tracker}").exists()
    bare.run("demo", "output_dir=r", "train.max_steps=2", "train.report_to=[]")

    bare.pip("uninstall", "-y", "matplotlib")
    bare.refuses("report", "r", "--out", "r_report", says="pip install matplotlib")
    assert not (bare.work / "r_report").exists()

    bare.pip("uninstall", "-y", "tensorboard")
    bare.refuses("demo", "output_dir=t_tb", says="pip install tensorboard")
    assert not (bare.work / "t_tb").exists()
    bare.run("demo", "output_dir=t_none", "train.max_steps=2", "train.report_to=[]")  # the way out it names

    bare.pip("uninstall", "-y", "orjson")  # a speed-up with a fallback
    (bare.work / "d.jsonl").write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "reward": 0.5}))
    bare.run("rollouts", "convert", "--from", "generic", "d.jsonl", "--out", "c2")
