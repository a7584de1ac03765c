"""deploy/kubernetes/job.yaml, with no cluster: valid against the batch/v1 Job schema that
kubernetes-validate bundles (strict: a misspelt key fails), the podFailurePolicy's rules as the API
server would take them, and its exit codes exactly trainsup's contract (``commands.exitcodes``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainsup.commands import exitcodes

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra's kubernetes-validate")

JOB = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "job.yaml"
KUBERNETES = "1.37.0"  # the newest schema kubernetes-validate 1.37 bundles; podFailurePolicy is GA since 1.31


def _job() -> dict[str, Any]:
    job = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    assert isinstance(job, dict)
    return job


def test_the_job_is_valid_against_the_schema() -> None:
    job = _job()
    kubernetes_validate.validate(job, KUBERNETES, strict=True)
    job["spec"]["podFailurePolicy"]["rules"][0]["onExitCode"] = {}  # the schema catches a misspelt key
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES, strict=True)


def test_the_pod_failure_policy_is_what_the_api_server_accepts() -> None:
    # What the schema does not hold, the API server's validation of a Job does.
    spec = _job()["spec"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # required with a podFailurePolicy
    names = {c["name"] for c in pod["containers"]}
    for rule in spec["podFailurePolicy"]["rules"]:
        assert rule["action"] in {"FailJob", "FailIndex", "Ignore", "Count"}
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)
        codes = rule.get("onExitCodes")
        if codes:
            assert codes["operator"] in {"In", "NotIn"} and codes.get("containerName", next(iter(names))) in names
            values = codes["values"]
            assert values == sorted(set(values)) and all(0 <= v <= 255 for v in values)
            assert codes["operator"] != "In" or 0 not in values


def test_the_exit_codes_are_trainsups_contract() -> None:
    rules = _job()["spec"]["podFailurePolicy"]["rules"]
    by_action = {r["action"]: r["onExitCodes"]["values"] for r in rules if "onExitCodes" in r}
    assert by_action["FailJob"] == list(exitcodes.NOT_RETRYABLE)
    retryable = [c.code for c in exitcodes.CODES if c.retry_helps]
    assert by_action["Count"] == retryable
    # Every code of the contract has its rule, 0 aside (a finished Job): none is left to the default.
    assert sorted(by_action["FailJob"] + by_action["Count"]) == sorted(c.code for c in exitcodes.CODES if c.code)
    ignored = [r for r in rules if r["action"] == "Ignore"]
    assert ignored and all(c["type"] == "DisruptionTarget" for r in ignored for c in r["onPodConditions"])
    # The DisruptionTarget rule comes before the Count rule: an evicted pod's 143 is not counted.
    actions = [r["action"] for r in rules]
    assert actions.index("Ignore") < actions.index("Count")
    container = _job()["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["trainsup", "run", "--project"]


def test_the_docs_table_names_every_code_once() -> None:
    page = (JOB.parents[2] / "docs" / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    section = page.split("## The exit-code contract", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `") and line[3].isdigit()]
    named = [int(code) for row in rows for code in row.split("|")[1].replace("`", "").split(",")]
    assert sorted(named) == sorted(c.code for c in exitcodes.CODES)


def test_the_header_comment_names_every_code_of_the_rules() -> None:
    header = "".join(line for line in JOB.read_text(encoding="utf-8").splitlines(keepends=True)
                     if line.startswith("#"))
    said = {int(n) for n in re.findall(r"\b(\d{1,3})\b", header)}
    rules = _job()["spec"]["podFailurePolicy"]["rules"]
    codes = {v for r in rules if "onExitCodes" in r for v in r["onExitCodes"]["values"]}
    assert codes <= said, f"job.yaml's header comment does not name {sorted(codes - said)}"
