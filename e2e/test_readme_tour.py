"""The README's five-minute tour, run as written against the e2e cluster.

Every command in the tour's `bash` blocks runs in one bash script (`set -euo pipefail`), from the
repository root, with KUBECONFIG set to the harness's cluster. The pod runner serves simulator pods
here as it does on the demo's cluster, so the curl to the frontend's pod IP gets a real completion.
The only commands not run are the ones that name the demo itself, each listed with the reason. A
tour edited so that one of its commands fails, or one that stops serving, fails this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import harness as harness_mod

REPO = Path(__file__).resolve().parent.parent
TOUR_HEADING = "## Using it: a five-minute tour"
# Commands of the tour this test does not run, by how they begin, and why.
NOT_RUN = {
    "scripts/demo.sh up": "the harness's cluster stands in for the demo's",
    "scripts/demo.sh down": "the harness stops its own cluster",
    'eval "$(fleetpilot cluster env)"': "it names the demo's cluster (dev); KUBECONFIG names the harness's",
    "kubectl get dg -A -w": "a watch that runs until Ctrl-C",
    "kubectl -n demo ": "the demo's own graph exists only after the demo's replay",
}
SAMPLE = "manifests/samples/simulator.yaml"


def tour_commands(readme: str) -> list[str]:
    """The tour's commands in order: each `bash` block of its section, continuation lines joined."""
    section = readme.split(TOUR_HEADING, 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        pending = ""
        for line in block.splitlines():
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.strip():
                commands.append(pending.strip())
            pending = ""
    return commands


def runnable(command: str) -> bool:
    return not any(command.startswith(prefix) for prefix in NOT_RUN)


def test_the_tour_finds_its_commands() -> None:
    """What the tour test runs is the README's: every skipped command is one the README has."""
    commands = tour_commands((REPO / "README.md").read_text())
    assert any(c.startswith(f"kubectl apply -f {SAMPLE}") for c in commands), commands
    assert any(c.startswith("curl ") for c in commands), commands
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in commands), f"the tour no longer has {prefix!r}: update NOT_RUN"


def test_the_readme_tour_runs_as_written(harness: harness_mod.Harness) -> None:
    commands = [c for c in tour_commands((REPO / "README.md").read_text()) if runnable(c)]
    # Each command's output is framed, so the checks below can tell whose it is.
    script = "set -euo pipefail\n" + "\n".join(
        f"echo '>>> {i}'\n{command}" for i, command in enumerate(commands))
    env = {**os.environ, "KUBECONFIG": str(harness.config.kubeconfig)}
    try:
        done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, check=False,
                              timeout=600)
    finally:
        harness.kubectl.run("delete", "-f", str(REPO / SAMPLE), "--ignore-not-found", check=False)
        # The scenarios after this one share the nodes' GPUs: wait until the tour's pods have released theirs.
        harness_mod.wait_for(lambda: not harness.kubectl.json(
            "get", "pods", "-n", "default", "-l", "fleetpilot.dev/graph=llama-8b-sim")["items"], timeout=120,
            what="the tour's pods gone")
    assert done.returncode == 0, f"the tour failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    outputs = dict(zip(commands, re.split(r"^>>> \d+\n", done.stdout, flags=re.MULTILINE)[1:], strict=True))
    (listing,) = [out for c, out in outputs.items() if c.startswith("kubectl get dg llama-8b-sim")]
    assert re.search(r"^llama-8b-sim\s+True\s+1/1\s+2/2\s+2/2", listing, flags=re.MULTILINE), listing
    (answer,) = [out for c, out in outputs.items() if c.startswith("curl ")]
    completion = json.loads(answer)
    assert completion["model"] == "llama-8b" and completion["choices"][0]["text"], completion
    # kubectl logs, through the apiserver to the pod runner's kubelet endpoint: the frontend's own lines.
    (logs,) = [out for c, out in outputs.items() if c.startswith("kubectl logs ")]
    assert re.search(r"INFO fleetpilot\.frontend: worker llama-8b-sim-decode-\S+ \(decode", logs), logs
