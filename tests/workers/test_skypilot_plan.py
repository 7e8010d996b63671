"""The SkyPilot provider's pure half: zones, cluster names, the task a launch renders, and
what SkyPilot's answers mean for a replica's state."""

from __future__ import annotations

import pytest

from workers.providers.skypilot_plan import (
    ClusterRecord,
    LaunchOutcome,
    SkyPilotConfig,
    SkyZone,
    cluster_name,
    endpoint_url,
    launch_kwargs,
    observe,
    parse_zones,
    plan_lines,
    records_from,
    task_config,
    to_yaml,
)

ZONES = "aws/us-east-1/us-east-1a, gcp/us-central1/us-central1-a"
CONFIG = SkyPilotConfig(parse_zones(ZONES), accelerators="L4:1", port=8000)


def test_zones_parse_as_cloud_region_zone() -> None:
    assert parse_zones(ZONES) == (
        SkyZone("aws", "us-east-1", "us-east-1a"),
        SkyZone("gcp", "us-central1", "us-central1-a"),
    )
    assert parse_zones(ZONES)[1].infra == "gcp/us-central1/us-central1-a"


@pytest.mark.parametrize("bad", ["aws/us-east-1", "aws//us-east-1a", "a/b/c/d"])
def test_a_malformed_zone_names_the_format_it_expected(bad: str) -> None:
    with pytest.raises(ValueError, match="expected cloud/region/zone"):
        parse_zones(bad)


def test_a_zone_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        parse_zones("aws/us-east-1/z1,gcp/us-central1/z1")


def test_config_refuses_no_zones_and_a_bad_port() -> None:
    with pytest.raises(ValueError, match="no zones"):
        SkyPilotConfig(())
    with pytest.raises(ValueError, match="not a TCP port"):
        SkyPilotConfig(parse_zones(ZONES), port=70000)
    with pytest.raises(ValueError, match="KV events port"):
        SkyPilotConfig(parse_zones(ZONES), port=5557)


def test_cluster_names_are_prefixed_lowercase_and_bounded() -> None:
    assert cluster_name("Llama-spot-us-east-1a-0f3a2b") == "mer-llama-spot-us-east-1a-0f3a2b"
    assert cluster_name("m_1.5b spot") == "mer-m-1-5b-spot"
    with pytest.raises(ValueError, match="no letters or digits"):
        cluster_name("--")


def test_a_long_replica_name_keeps_its_unique_end() -> None:
    long = "meta-llamallama-33-70b-instruct-awq-int4-on-demand-us-central1-a-0f3a2b"
    name = cluster_name(long)
    assert len(name) == 63 and name.startswith("mer-meta-llama") and name.endswith("-0f3a2b")
    assert cluster_name(long.replace("0f3a2b", "99aa01")) != name


def test_a_spot_launch_is_pinned_to_the_zone_spothedge_chose() -> None:
    task = task_config(CONFIG, "meta-llama/Llama-3.1-8B", "r1", "us-east-1a", "spot")
    assert task["name"] == "mer-r1"
    assert task["resources"] == {
        "infra": "aws/us-east-1/us-east-1a",
        "accelerators": "L4:1",
        "use_spot": True,
        "ports": [8000, 5557, 5558],
        "disk_size": 256,
    }
    assert task["envs"] == {"MODEL": "meta-llama/Llama-3.1-8B", "PORT": "8000"}
    assert 'vllm serve "$MODEL"' in task["run"] and "--enable-prompt-tokens-details" in task["run"]
    assert '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"' in task["run"]


def test_an_on_demand_launch_with_an_image() -> None:
    config = SkyPilotConfig(parse_zones(ZONES), image_id="projects/p/global/images/vllm")
    task = task_config(config, "m", "r2", "us-central1-a", "on-demand")
    assert task["resources"]["use_spot"] is False
    assert task["resources"]["infra"] == "gcp/us-central1/us-central1-a"
    assert task["resources"]["image_id"] == "projects/p/global/images/vllm"


def test_a_launch_outside_the_configured_zones_or_kinds_is_refused() -> None:
    with pytest.raises(KeyError, match="not a configured SkyPilot zone"):
        task_config(CONFIG, "m", "r", "eu-west-1a", "spot")
    with pytest.raises(ValueError, match="kind 'reserved'"):
        task_config(CONFIG, "m", "r", "us-east-1a", "reserved")


def test_launch_fails_fast_and_never_retries_elsewhere() -> None:
    assert launch_kwargs("r1") == {
        "cluster_name": "mer-r1",
        "retry_until_up": False,
        "down": True,
        "idle_minutes_to_autostop": None,
    }


UP = ClusterRecord("mer-r1", "UP")
INIT = ClusterRecord("mer-r1", "INIT")


def test_provisioning_waits_for_the_request_the_cluster_and_the_engine() -> None:
    pending = LaunchOutcome("RUNNING")
    done = LaunchOutcome("SUCCEEDED")
    assert observe("provisioning", "spot", pending, INIT, False).notice is None
    assert observe("provisioning", "spot", done, INIT, False).notice is None
    assert observe("provisioning", "spot", done, UP, False).state == "provisioning"
    running = observe("provisioning", "spot", done, UP, True)
    assert (running.state, running.notice) == ("running", "running")


def test_a_cluster_gone_once_its_launch_resolved_ends_the_replica() -> None:
    # After the launch succeeded, or for a cluster adopted after a restart (no request).
    done = LaunchOutcome("SUCCEEDED")
    assert observe("provisioning", "spot", done, None, False).notice == "preempted"
    assert observe("provisioning", "on-demand", None, None, False).notice == "terminated"
    # While the launch request runs, the cluster may not be listed yet.
    assert observe("provisioning", "spot", LaunchOutcome("PENDING"), None, False).notice is None


def test_a_launch_without_capacity_is_a_preemption_other_failures_terminate() -> None:
    refused = LaunchOutcome("FAILED", "ResourcesUnavailableError", "no L4 in us-east-1a", 1)
    seen = observe("provisioning", "spot", refused, None, False)
    assert (seen.state, seen.notice) == ("preempted", "preempted")
    assert "no L4 in us-east-1a" in seen.message
    # The optimizer's refusal, before any attempt: a configuration error, not a full zone.
    infeasible = LaunchOutcome("FAILED", "ResourcesUnavailableError", "not enabled", 0)
    assert observe("provisioning", "spot", infeasible, None, False).notice == "terminated"
    broken = LaunchOutcome("FAILED", "InvalidCloudCredentials", "expired")
    assert observe("provisioning", "on-demand", broken, None, False).notice == "terminated"
    cancelled = LaunchOutcome("CANCELLED")
    assert observe("provisioning", "spot", cancelled, None, False).notice == "terminated"


def test_a_running_cluster_that_leaves_up_is_preempted_if_spot() -> None:
    assert observe("running", "spot", None, UP, True).notice is None
    assert observe("running", "spot", None, None, False).notice == "preempted"
    assert observe("running", "spot", None, INIT, False).notice == "preempted"
    assert observe(
        "running", "on-demand", None, ClusterRecord("mer-r1", "STOPPED"), False
    ).notice == ("terminated")
    with pytest.raises(ValueError, match="no transition"):
        observe("terminated", "spot", None, None, False)


def test_endpoints_become_urls() -> None:
    assert endpoint_url("34.1.2.3:8000") == "http://34.1.2.3:8000"
    assert endpoint_url("https://x.example") == "https://x.example"
    with pytest.raises(ValueError, match="empty endpoint"):
        endpoint_url("")


def test_status_rows_need_a_name_and_a_status() -> None:
    assert records_from([{"name": "mer-a", "status": "UP"}]) == {
        "mer-a": ClusterRecord("mer-a", "UP")
    }
    with pytest.raises(ValueError, match="without a name and status"):
        records_from([{"name": "mer-a"}])


def test_the_plan_lists_every_call_in_order() -> None:
    lines = plan_lines(CONFIG, "m", "r1", "us-east-1a", "spot")
    assert [line.split(".")[0] for line in lines] == ["1", "2", "3", "4", "5", "6"]
    assert "sky.launch(task, cluster_name='mer-r1', retry_until_up=False" in lines[1]
    assert "aws/us-east-1/us-east-1a" in lines[0] and "spot" in lines[0]
    assert "ResourcesUnavailableError" in lines[2]
    assert lines[-1] == "6. scale-down: sky.down('mer-r1')"


def test_the_yaml_reads_back_as_the_task() -> None:
    yaml = pytest.importorskip("yaml")
    task = task_config(CONFIG, "meta-llama/Llama-3.1-8B", "r1", "us-east-1a", "spot")
    task["file_mounts"] = {}
    assert yaml.safe_load(to_yaml(task)) == task
