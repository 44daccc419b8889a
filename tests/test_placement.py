"""eaglelab.placement: which outputs move where, from the config alone (no host is asked)."""

from __future__ import annotations

import pytest
import yaml

from eaglelab import config, placement
from eaglelab.errors import ConfigError


def load(tmp_path, hosts: dict, stages: dict, **lab_extra):
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    full = {n: {"reach": "ssh", "ssh": {"host": n}, **h} for n, h in hosts.items()}
    (conf / "lab.yaml").write_text(yaml.safe_dump({"profile": "none", "logs_dir": str(tmp_path / "logs"),
                                                   "hosts": full, **lab_extra}))
    (conf / "pipeline.yaml").write_text(yaml.safe_dump({"vars": {"data": "data/x"}, "stages": stages}))
    return config.load(conf)


STAGES = {"a": {"host": "h1", "command": ["true"], "outputs": ["${data}/a", "${data}/a.json"]},
          "b": {"host": "h2", "command": ["true"], "inputs": ["${data}/a/shard-0", "${data}/a.json"],
                "depends_on": ["a"]},
          "c": {"host": "h2", "command": ["true"], "inputs": ["${data}/a"]},
          "d": {"host": "h1", "command": ["true"], "inputs": ["${data}/a"]}}


def test_an_output_read_on_another_host_gets_one_transfer_per_receiving_host(tmp_path):
    cfg = load(tmp_path, {"h1": {}, "h2": {}}, STAGES)
    t = cfg.stage("move-a-to-h2").transfer
    assert (t.producer, t.src, t.dst, t.paths, t.readers) == ("a", "h1", "h2", ("data/x/a", "data/x/a.json"), ("b", "c"))
    assert "move-a-to-h1" not in cfg.stages  # d reads it where it is made
    assert cfg.stage("b").depends_on == ["a", "move-a-to-h2"] and cfg.stage("c").depends_on == ["move-a-to-h2"]
    assert cfg.stage("move-a-to-h2").host == placement.CONTROLLER and cfg.host(placement.CONTROLLER).reach == "local"
    order = cfg.stage_order()
    assert order.index("a") < order.index("move-a-to-h2") < order.index("b")


def test_a_shared_filesystem_moves_nothing_but_only_under_its_prefix(tmp_path):
    cfg = load(tmp_path, {"h1": {"shared": {"data": "nfs"}}, "h2": {"shared": {"data": "nfs"}}}, STAGES)
    assert not [n for n in cfg.stages if n.startswith("move-")]
    cfg = load(tmp_path, {"h1": {"shared": {"data/y": "nfs"}}, "h2": {"shared": {"data/y": "nfs"}}}, STAGES)
    assert "move-a-to-h2" in cfg.stages  # data/x is not under data/y
    cfg = load(tmp_path, {"h1": {"shared": {"data": "nfs1"}}, "h2": {"shared": {"data": "nfs2"}}}, STAGES)
    assert "move-a-to-h2" in cfg.stages  # two different filesystems


def test_under_compares_whole_path_components():
    assert placement.under("data/ab", "data/ab") and placement.under("data/ab/c", "data/ab")
    assert not placement.under("data/abc", "data/ab") and not placement.under("data", "data/ab")
    assert placement.under("data/./ab/", "data/ab") and placement.under("x/y", ".")
    assert not placement.under("/abs/y", ".")


def test_placement_in_lab_yaml_overrides_the_pipeline(tmp_path):
    cfg = load(tmp_path, {"h1": {}, "h2": {}}, STAGES, placement={"b": "h1", "c": "h1"})
    assert cfg.stage("b").host == "h1" and not [n for n in cfg.stages if n.startswith("move-")]


def test_a_local_host_runs_the_transfers_and_names_are_checked(tmp_path):
    cfg = load(tmp_path, {"h1": {}, "h2": {}, "here": {"reach": "local"}}, STAGES)
    assert cfg.stage("move-a-to-h2").host == "here" and placement.CONTROLLER not in cfg.hosts
    with pytest.raises(ConfigError, match="direct_to: no host 'h9'"):
        load(tmp_path, {"h1": {"direct_to": ["h9"]}, "h2": {}}, STAGES)
    with pytest.raises(ConfigError, match="taken by eaglelab's transfer"):
        load(tmp_path, {"h1": {}, "h2": {}}, {**STAGES, "move-a-to-h2": {"host": "h1", "command": ["true"]}})


def test_an_argument_naming_another_stages_output_is_moved_even_if_undeclared(tmp_path):
    stages = {"a": STAGES["a"], "e": {"host": "h2", "command": ["prog", "--model", "${data}/a", "--out", "${data}/e"],
                                      "outputs": ["${data}/e"], "depends_on": ["a"]}}
    cfg = load(tmp_path, {"h1": {}, "h2": {}}, stages)
    assert cfg.stage("move-a-to-h2").transfer.paths == ("data/x/a",)
    # not upstream (or the reader's own output, inside another's): no transfer, and so no cycle
    stages = {"out": {"host": "h1", "command": ["true"], "outputs": ["${data}/eval"], "depends_on": ["base"]},
              "base": {"host": "h2", "command": ["prog", "--out", "${data}/eval/base.json"],
                       "outputs": ["${data}/eval/base.json"]}}
    cfg = load(tmp_path, {"h1": {}, "h2": {}}, stages)
    assert not [n for n in cfg.stages if n.startswith("move-")]  # loaded: no cycle, nothing moves
