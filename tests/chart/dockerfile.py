"""A small Dockerfile reader (instructions, stages, ARG defaults) and a replayer of one stage's
COPY/RUN/ENV/WORKDIR steps on this machine, for the tests: no Docker engine runs here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case, e.g. "RUN"
    value: str  # the rest, continuation lines joined
    line: int


@dataclass
class Stage:
    base: str  # as written, e.g. "${PYTHON_IMAGE}"
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def lineage(self, stage: Stage) -> list[Stage]:
        """The stage and the stages it is built FROM, oldest first (the first one's base is an image)."""
        chain = [stage]
        while any(s.name == chain[0].base for s in self.stages):
            chain.insert(0, self.stage(chain[0].base))
        return chain

    def inherited(self, stage: Stage, keyword: str) -> list[Instruction]:
        """A stage's instructions of one kind, its parent stages' included (what the image ends up with)."""
        return [i for s in self.lineage(stage) for i in s.all(keyword)]

    def image_base(self, stage: Stage) -> str:
        return self.resolve(self.lineage(stage)[0].base)

    def resolve(self, text: str) -> str:
        """Substitute the global ARG defaults (what a build without --build-arg uses)."""
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.global_args.get(m.group(1), m.group(0)), text)


def parse(path: Path = DOCKERFILE) -> Dockerfile:
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue  # comments and parser directives (# syntax=...)
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped by Docker too
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, value = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip(), start))

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = instruction.value.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            if instruction.keyword == "ARG":
                key, _, default = instruction.value.partition("=")
                global_args[key] = default
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def env_pairs(value: str) -> dict[str, str]:
    """`ENV A=1 B="x y"` (the key=value form; the legacy `ENV A 1` form is not used here)."""
    import shlex

    return dict(token.split("=", 1) for token in shlex.split(value))


def exec_form(value: str) -> list[str] | None:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed) else None


def replay_stage(dockerfile: Dockerfile, name: str, root: Path, *, keep_pip_cache: bool = True) -> dict[str, str]:
    """Run a stage's steps with every container path moved under `root`; returns the final env.

    The stages it is built FROM are replayed first, into the same root (Docker starts a stage
    from its parent's file system, env and working directory).
    COPY copies from the repository (minus what .dockerignore leaves out: caches), RUN runs in
    /bin/sh like Docker's shell form. The base image's own `python`/`python3` is this test's
    interpreter (same minor version). keep_pip_cache drops PIP_NO_CACHE_DIR: a cache changes how long the
    download takes, never what is installed.
    """
    shims = root / "_shims"
    shims.mkdir(parents=True)
    (shims / "python").symlink_to(sys.executable)
    (shims / "python3").symlink_to(sys.executable)
    env = {
        "PATH": f"{shims}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(root)),
        "LANG": "C.UTF-8",
    }
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT", "SSL_CERT_FILE", "PIP_CACHE_DIR"):
        if key in os.environ:  # the machine's registry settings, as a builder would have them
            env[key] = os.environ[key]
    workdir = root
    for stage in dockerfile.lineage(dockerfile.stage(name)):
        workdir = _replay_steps(stage, root, env, workdir, keep_pip_cache=keep_pip_cache)
    return env


def _replay_steps(stage: Stage, root: Path, env: dict[str, str], workdir: Path, *, keep_pip_cache: bool) -> Path:
    """One stage's steps, on top of `env` and `workdir` (both carried on to the next stage)."""

    def here(container_path: str) -> Path:
        return root / PurePosixPath(container_path).relative_to("/")

    def relocate(text: str) -> str:
        # Absolute container paths in ENV/RUN (e.g. /opt/venv) move under root.
        return re.sub(r"(?<![\w.$])/(opt|src|app|srv|usr/src)(?=[/\s\"':]|$)", lambda m: f"{root}/{m.group(1)}", text)

    for step in stage.instructions:
        if step.keyword == "ENV":
            for key, value in env_pairs(step.value).items():
                value = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)
                env[key] = relocate(value)
            if keep_pip_cache:
                env.pop("PIP_NO_CACHE_DIR", None)
        elif step.keyword == "WORKDIR":
            workdir = here(step.value)
            workdir.mkdir(parents=True, exist_ok=True)
        elif step.keyword == "COPY":
            *sources, dest = step.value.split()
            assert not any(s.startswith("--") for s in sources), f"line {step.line}: COPY flags not replayed"
            for source in sources:
                origin = REPO / source
                target = here(dest) if dest.startswith("/") else workdir / dest
                if origin.is_dir():  # like Docker: the directory's contents, not the directory
                    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.egg-info")
                    shutil.copytree(origin, target, dirs_exist_ok=True, ignore=ignore)
                    continue
                if dest.endswith("/") or len(sources) > 1:
                    target.mkdir(parents=True, exist_ok=True)
                    target = target / origin.name
                shutil.copy2(origin, target)
        elif step.keyword == "RUN":
            command = relocate(step.value)
            result = subprocess.run(
                ["/bin/sh", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=900
            )
            output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            assert result.returncode == 0, f"RUN at line {step.line} failed:\n{output}"
        elif step.keyword in ("ARG", "LABEL", "EXPOSE", "USER", "ENTRYPOINT", "CMD"):
            continue
        else:
            raise AssertionError(f"line {step.line}: {step.keyword} is not replayed; teach tests/chart/dockerfile.py")
    return workdir
