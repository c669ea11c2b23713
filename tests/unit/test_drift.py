"""When the operator may skip an apply: what we applied before, and nobody changed what we set."""

from __future__ import annotations

import copy
from typing import Any

from fleetpilot.api import contract
from fleetpilot.operator import drift


def desired() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "g-decode", "namespace": "ns", "labels": {"a": "1", "b": "2"}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "engine", "image": "img:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}},
    }


def live_after_apply(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server gives back: our fields, plus defaults and status, quantities as strings."""
    live = copy.deepcopy(drift.with_digest(manifest))
    live["metadata"].update({"uid": "u1", "resourceVersion": "7", "generation": 1})
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["resources"]["limits"]["nvidia.com/gpu"] = "1"
    live["status"] = {"replicas": 2}
    return live


def test_a_child_as_we_applied_it_needs_no_write_despite_server_defaults() -> None:
    assert drift.up_to_date(live_after_apply(desired()), desired())


def test_a_hand_edit_of_a_field_we_set_is_drift() -> None:
    live = live_after_apply(desired())
    live["spec"]["replicas"] = 5
    assert not drift.up_to_date(live, desired())
    live = live_after_apply(desired())
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "img:hacked"
    assert not drift.up_to_date(live, desired())


def test_a_field_we_stopped_setting_changes_the_digest() -> None:
    live = live_after_apply(desired())
    smaller = desired()
    del smaller["metadata"]["labels"]["b"]
    assert drift.contains(live, smaller)  # the live object still has it: only the digest tells
    assert not drift.up_to_date(live, smaller)


def test_a_removed_list_element_is_drift() -> None:
    two = desired()
    two["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "s:1"})
    assert not drift.contains(live_after_apply(desired()), two)


def test_an_object_nobody_stamped_is_applied() -> None:
    live = live_after_apply(desired())
    del live["metadata"]["annotations"][contract.ANNOTATION_APPLIED]
    assert not drift.up_to_date(live, desired())


def test_the_digest_ignores_its_own_annotation_and_key_order() -> None:
    stamped = drift.with_digest(desired())
    assert drift.digest(stamped) == drift.digest(desired())
    reordered = {k: desired()[k] for k in reversed(list(desired()))}
    assert drift.digest(reordered) == drift.digest(desired())


def test_booleans_are_not_numbers() -> None:
    assert not drift.contains({"x": 1}, {"x": True})
    assert drift.contains({"x": True}, {"x": True})


def test_the_digest_is_the_one_earlier_operators_stamped() -> None:
    """Live children carry the digest an earlier operator wrote: if its value changed, an upgrade would
    re-apply every child of every graph at once."""
    assert drift.digest(desired()) == "0927e4914949e246"
    with_notes = desired()
    with_notes["metadata"]["annotations"] = {"note": "kept", contract.ANNOTATION_APPLIED: "stale"}
    assert drift.digest(with_notes) == "1268516886458979" != drift.digest(desired())
    with_notes["metadata"]["annotations"] = {}
    assert drift.digest(with_notes) == drift.digest(desired())


def test_stamping_and_digesting_leave_the_manifest_as_it_was() -> None:
    manifest = desired()
    manifest["metadata"]["annotations"] = {"note": "kept"}
    stamped = drift.with_digest(manifest)
    assert manifest == {**desired(), "metadata": {**desired()["metadata"], "annotations": {"note": "kept"}}}
    assert stamped["metadata"]["annotations"] == {"note": "kept", contract.ANNOTATION_APPLIED: drift.digest(manifest)}
    assert drift.with_digest(manifest, applied="given")["metadata"]["annotations"][contract.ANNOTATION_APPLIED] == "given"
