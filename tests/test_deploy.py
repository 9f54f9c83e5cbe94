"""The deployment files agree with the CLI, the config loader and each other.

Each of systemd, Docker, compose and Kubernetes runs ``figtank serve`` with flags that must
exist; all use the same config path, data directory and ports (8119 Figg, 11011 Tank,
9092 Kafka, 9464 metrics, 8080 HTTP). YAML is read with small targeted extractions (no YAML
dependency).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
import urllib.request
from pathlib import Path

import pytest

from gateway.cli.main import build_parser, settings_from_args
from gateway.core.config import Settings, load_settings, parse_address, settings_from_mapping
from tests.serving import figtank_serve

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
CONFIG_PATH = "/etc/figtank/figtank.toml"
DATA_DIR = "/var/lib/figtank"
PORTS = {"figg": 8119, "tank": 11011, "kafka": 9092, "metrics": 9464, "http": 8080}
UID = 999


def text(name: str) -> str:
    return (DEPLOY / name).read_text()


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text("Dockerfile"))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def docker(instruction: str) -> list[str]:
    return [args for name, args in dockerfile() if name == instruction]


def yaml_flow_list(document: str, key: str) -> list[str]:
    """The one ``key: ["a", "b"]`` line of a YAML file (a flow list of quoted strings is
    also JSON)."""
    [found] = re.findall(rf"^\s*{key}:\s*(\[.*\])\s*$", document, re.MULTILINE)
    return json.loads(found)


def kube() -> str:
    return text("kubernetes/figtank.yaml")


def kube_configmap_toml() -> str:
    """The ``figtank.toml: |`` block of the ConfigMap, dedented."""
    match = re.search(r"^  figtank\.toml: \|\n((?:    .*\n|\n)+)", kube(), re.MULTILINE)
    assert match, "no figtank.toml in the ConfigMap"
    return textwrap.dedent(match.group(1))


def serve_commands() -> dict[str, list[str]]:
    """The ``figtank`` arguments each deployment runs."""
    [exec_start] = re.findall(r"^ExecStart=(.*)$", text("figtank.service"), re.MULTILINE)
    systemd = shlex.split(exec_start)
    assert systemd[0].endswith("/bin/figtank")
    [entrypoint] = docker("ENTRYPOINT")
    assert json.loads(entrypoint) == ["figtank"]
    [cmd] = docker("CMD")
    return {"systemd": systemd[1:], "docker": json.loads(cmd),
            "compose": yaml_flow_list(text("compose.yaml"), "command"),
            "kubernetes": yaml_flow_list(kube(), "args")}


def serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices["serve"]


def flags(argv: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("-")]


def deploy_settings() -> Settings:
    return load_settings(DEPLOY / "figtank.toml")


@pytest.mark.parametrize("deployment", ["systemd", "docker", "compose", "kubernetes"])
def test_serve_command_uses_known_flags(deployment: str, tmp_path: Path) -> None:
    argv = serve_commands()[deployment]
    assert argv[0] == "serve"
    known = {option for action in serve_parser()._actions for option in action.option_strings}
    assert set(flags(argv)) <= known
    args = build_parser().parse_args(argv)
    assert str(args.config) == CONFIG_PATH
    # What the deployment runs with: its config file (Kubernetes: the ConfigMap's copy).
    local = tmp_path / "figtank.toml"
    local.write_text(kube_configmap_toml() if deployment == "kubernetes"
                     else text("figtank.toml"))
    args.config = local
    settings = settings_from_args(args)
    assert str(settings.data_dir) == DATA_DIR
    assert {name: parse_address(getattr(settings, f"{name}_listen"))[1] for name in PORTS} \
        == PORTS


def test_serve_help_lists_the_flags() -> None:
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    for argv in serve_commands().values():
        for flag in flags(argv):
            assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", result.stdout), flag


def test_config_files_load_and_agree() -> None:
    settings = deploy_settings()
    assert str(settings.data_dir) == DATA_DIR and settings.durability == "fsync"
    assert settings.figg_listen == f"0.0.0.0:{PORTS['figg']}"
    assert settings.tank_listen == f"0.0.0.0:{PORTS['tank']}"
    assert settings.metrics_listen == f"0.0.0.0:{PORTS['metrics']}"
    assert settings.log_format == "json"
    # The Kubernetes ConfigMap is a copy of deploy/figtank.toml.
    assert settings_from_mapping(tomllib.loads(kube_configmap_toml())) == settings


def test_dockerfile() -> None:
    assert {int(p) for e in docker("EXPOSE") for p in e.split()} == set(PORTS.values())
    assert [json.loads(v) for v in docker("VOLUME")] == [[DATA_DIR]]
    assert docker("COPY")[-1].split() == ["deploy/figtank.toml", CONFIG_PATH]
    assert docker("WORKDIR")[-1] == DATA_DIR
    # The build stage has what an sdist has (setup.py builds the extensions from the .pyx
    # files MANIFEST.in names); the image installs the wheel it built.
    assert docker("FROM")[0].endswith(" AS build")
    copied = {path for args in docker("COPY") if not args.startswith("--from")
              for path in args.split()[:-1]}
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "protocols",
            "gateway"} <= copied
    assert any("pip wheel" in r and "--wheel-dir /wheels" in r for r in docker("RUN"))
    assert "--from=build /wheels /wheels" in docker("COPY")
    assert any(r.startswith("pip install --no-cache-dir /wheels/") for r in docker("RUN"))
    assert docker("USER") == ["figtank"]
    [run] = [r for r in docker("RUN") if "useradd" in r]
    assert f"--uid {UID}" in run and f"--gid {UID}" in run and f"--home-dir {DATA_DIR}" in run
    assert docker("STOPSIGNAL") == ["SIGTERM"]


def test_compose() -> None:
    compose = text("compose.yaml")
    published = re.findall(r'^\s*- "(?:[\d.]+:)?(\d+):(\d+)"', compose, re.MULTILINE)
    assert sorted(int(c) for _, c in published) == sorted(PORTS.values())
    assert all(h == c for h, c in published)
    assert re.search(rf"^\s*- figtank-data:{DATA_DIR}\s*$", compose, re.MULTILINE)
    assert f"127.0.0.1:{PORTS['metrics']}/health'" in compose
    assert re.search(r"^\s*dockerfile: deploy/Dockerfile$", compose, re.MULTILINE)


def test_kubernetes() -> None:
    manifest = kube()
    service = dict(re.findall(r"\{name: (\w+), port: (\d+)\}", manifest))
    container = dict(re.findall(r"\{name: (\w+), containerPort: (\d+)\}", manifest))
    assert {k: int(v) for k, v in service.items()} == PORTS
    assert {k: int(v) for k, v in container.items()} == PORTS
    assert f'prometheus.io/port: "{PORTS["metrics"]}"' in manifest
    assert re.findall(r"httpGet: \{path: (\S+), port: metrics\}", manifest) == [
        "/readyz", "/livez"]
    mounts = dict(re.findall(r"\{name: (\w+), mountPath: (\S+)\}", manifest))
    assert mounts == {"data": DATA_DIR, "config": str(Path(CONFIG_PATH).parent)}
    assert re.search(r"^\s+name: data$", manifest, re.MULTILINE)  # the volumeClaimTemplate
    [security] = re.findall(r"securityContext: \{(.*)\}", manifest)
    context = dict(item.split(": ") for item in security.split(", "))
    assert context["runAsUser"] == context["fsGroup"] == str(UID)


def test_systemd() -> None:
    unit = dict(re.findall(r"^(\w+)=(.*)$", text("figtank.service"), re.MULTILINE))
    assert unit["ReadWritePaths"] == DATA_DIR
    assert f"/var/lib/{unit['StateDirectory']}" == DATA_DIR
    assert unit["User"] == "figtank" and unit["KillSignal"] == "SIGTERM"
    # With workers, systemd's default (every process of the unit) would signal each
    # worker twice: once itself and once through the supervisor.
    assert unit["KillMode"] == "mixed"


def test_health_paths_the_deployments_probe(tmp_path: Path) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n[listen]\n'
                      'tank = "127.0.0.1:0"\nfigg = "127.0.0.1:0"\nmetrics = "127.0.0.1:0"\n')
    with figtank_serve("--config", str(config)) as server:
        assert server.metrics is not None
        host, port = server.metrics
        for path in ("/health", "/health/live", "/readyz", "/livez"):
            with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as answer:
                assert answer.status == 200, path
        assert server.stop() == 0
