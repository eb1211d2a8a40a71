"""The cluster environment (PET_*, torch's variables, an Indexed Job) read into a Topology, and its mode."""

from __future__ import annotations

import pytest

from tests.fakes import h100s, install, uuid_of
from tests.launch.common import plan_ok, torchrun_flags
from train.common.errors import ConfigError
from train.launch import topology as cluster


def test_pet_variables_win_over_torch_ones():
    topology = cluster.topology_from_env(
        {"PET_NNODES": "2", "NNODES": "5", "PET_NODE_RANK": "1", "NODE_RANK": "4", "MASTER_ADDR": "m", "NODE_X": "y"}
    )
    assert (topology.nnodes, topology.node_rank, topology.mode) == ("2", 1, "static")
    assert topology.address_to_wait_for == ("m", "MASTER_ADDR")
    static_endpoint = cluster.topology_from_env(
        {"NNODES": "2", "NODE_RANK": "1", "PET_RDZV_BACKEND": "static", "PET_RDZV_ENDPOINT": "host-0:29500"}
    )
    assert static_endpoint.mode == "static" and static_endpoint.address_to_wait_for == ("host-0", "PET_RDZV_ENDPOINT")


def test_node_rank_env_wins_over_completion_index_and_single_node_ignores_it():
    topology = cluster.topology_from_env(
        {"NNODES": "2", "NODE_RANK": "0", "JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "m"}
    )
    assert topology.node_rank == 0 and topology.address_to_wait_for is None  # node 0 hosts the store
    single = cluster.topology_from_env({"JOB_COMPLETION_INDEX": "3"})
    assert (single.mode, single.node_rank) == ("standalone", 0)


def test_elastic_range_without_endpoint_meets_at_the_master():
    topology = cluster.topology_from_env({"PET_NNODES": "2:4", "MASTER_ADDR": "m", "MASTER_PORT": "1234"})
    assert (topology.mode, topology.rdzv_backend, topology.rdzv_endpoint) == ("dynamic", "c10d", "m:1234")
    assert topology.address_to_wait_for == ("m", "MASTER_ADDR")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NNODES": "2"}, "needs the address of node 0"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "m"}, r"NODE_RANK=2: expected 0\.\.1"),
        ({"PET_NNODES": "two"}, "PET_NNODES='two': expected an integer"),
        ({"PET_NNODES": "4:2", "MASTER_ADDR": "m"}, "min <= max"),
        ({"PET_NNODES": "1:4"}, "PET_RDZV_ENDPOINT or PET_MASTER_ADDR"),
        ({"NNODES": "2", "NODE_RANK": "-1", "MASTER_ADDR": "m"}, "NODE_RANK='-1'"),
        ({"PET_NODE_RANK": "1"}, "PET_NODE_RANK=1 but the job has one node"),
        ({"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT='70000': expected an integer from 1 to 65535"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT='0': expected an integer from 1 to 65535"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http': expected an integer from 1 to 65535"),
        (
            {"PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": "m:70000"},
            "PET_RDZV_ENDPOINT='m:70000': expected host:port with a port from 1 to 65535",
        ),
        ({"PET_RDZV_ENDPOINT": "[::1]:0"}, r"PET_RDZV_ENDPOINT='\[::1\]:0': expected host:port"),
        ({"PET_MAX_RESTARTS": "100000"}, "PET_MAX_RESTARTS='100000': expected an integer from 0 to 1000"),
        # a static endpoint without a node count is one node (this was a KeyError traceback)
        (
            {"NODE_RANK": "1", "PET_RDZV_BACKEND": "static", "PET_RDZV_ENDPOINT": "h:1"},
            r"NODE_RANK=1: expected 0\.\.0 for one node \(PET_NNODES, NNODES unset\)",
        ),
        # the first error in reading order wins: the restarts are read before the rendezvous is checked
        ({"NNODES": "2", "PET_MAX_RESTARTS": "2000"}, "PET_MAX_RESTARTS='2000'"),
    ],
)
def test_topology_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        cluster.topology_from_env(env)


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, "standalone"),
        ({"NNODES": "1", "PET_RDZV_ID": "x"}, "standalone"),
        ({"NNODES": "2", "MASTER_ADDR": "m"}, "static"),
        ({"PET_RDZV_BACKEND": "static", "PET_RDZV_ENDPOINT": "h:1"}, "static"),
        ({"PET_NNODES": "1:2", "MASTER_ADDR": "m", "PET_RDZV_BACKEND": "static"}, "static"),
        ({"PET_RDZV_ENDPOINT": "h:1"}, "dynamic"),
        ({"PET_NNODES": "2", "PET_RDZV_ENDPOINT": "h:1", "PET_RDZV_BACKEND": "etcd"}, "dynamic"),
        ({"PET_NNODES": "1:2", "MASTER_ADDR": "m"}, "dynamic"),
    ],
)
def test_each_mode_has_one_predicate(env, mode):
    topology = cluster.topology_from_env(env)
    assert topology.mode == mode
    predicates = {"standalone": topology.is_standalone, "static": topology.is_static, "dynamic": topology.is_dynamic}
    assert [name for name, holds in predicates.items() if holds] == [mode]


def test_one_node_has_no_rendezvous():
    topology = cluster.topology_from_env({"MASTER_ADDR": "m", "NODE_RANK": "0"})
    assert topology.is_standalone and topology.rdzv_endpoint is None and topology.node_rank == 0
    assert topology.rendezvous_address is None and topology.address_to_wait_for is None
    assert not topology.hosts_rendezvous


def test_a_dynamic_rendezvous_gets_torchruns_defaults_and_an_elastic_one_meets_at_the_master():
    given = cluster.topology_from_env({"PET_NNODES": "2", "PET_RDZV_ENDPOINT": "h:5"})
    assert (given.rdzv_backend, given.rdzv_id, given.rendezvous_address) == ("c10d", "mlm-trainer", ("h", 5))
    assert not given.hosts_rendezvous and given.address_to_wait_for == ("h", "PET_RDZV_ENDPOINT")
    at_master = cluster.topology_from_env({"PET_NNODES": "1:3", "PET_MASTER_ADDR": "pm", "PET_RDZV_ID": "mine"})
    assert (at_master.rdzv_endpoint, at_master.rdzv_id) == ("pm:29500", "mine")
    assert at_master.sources["rdzv_endpoint"] == "PET_MASTER_ADDR"


def test_rdzv_conf_pairs_are_read_and_malformed_items_skipped():
    topology = cluster.topology_from_env({"PET_RDZV_CONF": " a = 1 ,b,=x,c=2,"})
    assert topology.rdzv_conf == {"a": "1", "c": "2"}


def test_split_endpoint():
    assert cluster.split_endpoint("h:29400") == ("h", 29400)
    assert cluster.split_endpoint("[fe80::1]:5") == ("fe80::1", 5)
    assert cluster.split_endpoint("h") == ("h", None)
    assert cluster.split_endpoint("h:http") == ("h:http", None)


def test_blank_variables_count_as_unset():
    topology = cluster.topology_from_env({"PET_NNODES": "  ", "NNODES": "2", "MASTER_ADDR": "m", "NODE_RANK": ""})
    assert (topology.nnodes, topology.node_rank, topology.sources["nnodes"]) == ("2", 0, "NNODES")


def test_a_huge_value_is_echoed_short():
    with pytest.raises(ConfigError, match=r"MASTER_PORT='1{59}…: expected an integer from 1 to 65535$"):
        cluster.topology_from_env({"MASTER_PORT": "1" * 5000})


def test_ports_at_the_edges_are_accepted():
    assert cluster.topology_from_env({"MASTER_PORT": "65535"}).master_port == 65535
    assert cluster.topology_from_env({"PET_MASTER_PORT": "1"}).master_port == 1
    elastic = cluster.topology_from_env({"PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": "m:65535"})
    assert elastic.rendezvous_address == ("m", 65535)
    assert cluster.topology_from_env({"PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": "m"}).rendezvous_address == ("m", 29500)


def test_options_override_kubeflow_values(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(8))
    env = {
        **base_env,
        "PET_NPROC_PER_NODE": "2",
        "PET_MAX_RESTARTS": "3",
        "MLM_MAX_RESTARTS": "1",
        "MLM_LOG_RANKS": "all",
        "MLM_RDZV_TIMEOUT": "120",
        "NNODES": "2",
        "MASTER_ADDR": "m",
    }
    flags = torchrun_flags(plan_ok(monkeypatch, capsys, env))
    assert flags[flags.index("--nproc-per-node") + 1] == "2"
    assert flags[flags.index("--max-restarts") + 1] == "1"
    assert flags[flags.index("--rdzv-conf") + 1] == "timeout=120"
    assert "--local-ranks-filter" not in flags
    env["MLM_NPROC_PER_NODE"] = "4"
    env["MLM_LOG_RANKS"] = "0,1"
    document = plan_ok(monkeypatch, capsys, env)
    flags = torchrun_flags(document)
    assert flags[flags.index("--nproc-per-node") + 1] == "4"
    assert flags[flags.index("--local-ranks-filter") + 1] == "0,1"
    assert document["env"]["CUDA_VISIBLE_DEVICES"].split(",") == [uuid_of(i) for i in range(4)]
