"""Template kinds are a registry (workloads/kinds/): a kind registered in a test, as data, renders valid manifests
under every architecture and is followed by the status follower, with no other module changed."""

from __future__ import annotations

from typing import Any

import pytest

from workloads import kinds
from workloads import manifests as m
from workloads.catalogue import template_specs
from workloads.kinds import BASE_ACTIONS, Kind, RenderOptions, TemplateDefaults
from workloads.models import TemplateKind
from workloads.status import derive

from .test_render import FLAVOR_KINDS_BY_ARCH, dry_run, make_request, top_level

EVAL_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["command"],
               "properties": {"command": {"type": "string", "minLength": 1}}}


def render_evaluation(request: Any, t: m.Target, options: RenderOptions) -> list[m.Manifest]:
    """An evaluation run: one Kueue-admitted batch/v1 Job, built only from the shared building blocks."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": m.metadata(t, labels=m.kueue_labels(t)),
        "spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            **({} if options.job_ttl_seconds is None else {"ttlSecondsAfterFinished": options.job_ttl_seconds}),
            "template": m.pod_template(request, t, [m.main_container(request)], restart_policy="Never"),
        },
    }
    return [job]


EVALUATION = Kind(
    name="evaluation", label="Evaluation run", render=render_evaluation, schema=EVAL_SCHEMA,
    defaults=TemplateDefaults("evaluation", "Evaluation run", "Score a checkpoint.", max_duration_hours=4),
    default_priority="batch", follows=("job",), actions=BASE_ACTIONS - {"extend"},
)


@pytest.fixture
def evaluation():
    with kinds.registered(EVALUATION) as kind:
        yield kind


def test_the_registry_restores_itself(evaluation) -> None:
    assert kinds.names() == ["notebook", "training", "inference", "batchinfer", "evaluation"]
    assert not kinds.allows("evaluation", "extend") and kinds.allows("evaluation", "stop")
    assert [spec.slug for spec in template_specs()] == ["notebook", "training", "inference", "batch-inference",
                                                        "evaluation"]


def test_after_the_block_only_the_built_in_kinds_are_left() -> None:
    with kinds.registered(EVALUATION):
        pass
    assert kinds.names() == ["notebook", "training", "inference", "batchinfer"] == TemplateKind.values
    with pytest.raises(ValueError, match="Unknown template kind 'evaluation'"):
        kinds.get("evaluation")


def test_a_kind_must_follow_objects_the_follower_knows() -> None:
    with pytest.raises(ValueError, match="the status follower knows"):
        kinds.register(Kind(name="raycluster", label="Ray", render=render_evaluation, schema={},
                            defaults=TemplateDefaults("ray", "Ray", ""), default_priority="batch", follows=("raycluster",)))
    assert "raycluster" not in kinds.names()


@pytest.mark.parametrize(("architecture", "flavor_kind"),
                         [(arch, fk) for arch, fks in FLAVOR_KINDS_BY_ARCH.items() for fk in fks])
def test_a_new_kind_renders_valid_manifests(evaluation, architecture: str, flavor_kind: str) -> None:
    request = make_request("evaluation", architecture=architecture, flavor_kind=flavor_kind,
                           parameters={"command": "python eval.py"})
    objects = kinds.request_manifests(request, job_ttl_seconds=600)
    stored = dry_run(objects)
    job = top_level(stored)
    assert job["metadata"]["labels"][m.KIND_LABEL] == "evaluation"
    assert job["metadata"]["labels"][m.QUEUE_LABEL] == "acme-vision"
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsGroup"] == m.RUN_AS_GROUP


def test_the_follower_reads_a_new_kinds_objects(evaluation) -> None:
    done = derive("evaluation", {"job": {"c": {"Complete": ["True", "", ""]}}})
    assert (done.state, done.reason) == ("succeeded", "Finished: the Job completed.")
    running = derive("evaluation", {"job": {"c": {}, "suspend": False}, "pod/req-42-x": {"phase": "Running"}})
    assert running.state == "running"
    assert "job" in kinds.top_level_keys()
