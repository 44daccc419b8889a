"""Config: a good config loads; a broken one names the file, the key, the bad value and the fix."""

from __future__ import annotations

import pytest

from eaglelab import config
from eaglelab.errors import ConfigError

PIPELINE = """\
vars:
  n: "5"
stages:
  a:
    host: local
    command: ["${python}", "-c", "print(${n})"]
  b:
    host: local
    command: ["true"]
    depends_on: [a]
"""


def load(tmplab, pipeline=PIPELINE, profile=None):
    tmplab.write_pipeline(pipeline)
    return config.load(tmplab.conf, profile)


def test_valid_config_loads_with_profile_vars(tmplab):
    tmplab.write_profile("big", "vars:\n  n: '500'\nstages:\n  b:\n    gpus: 2\n")
    cfg = load(tmplab, profile="big")
    assert cfg.profile == "big"
    assert cfg.stage("b").gpus == 2 and cfg.stage("b").depends_on == ["a"]
    assert cfg.stage_order() == ["a", "b"]
    a = cfg.stage("a")
    assert cfg.render(a, a.command[2], cfg.vars_for(a)) == "print(500)"


def test_a_profiles_env_reaches_every_stage_and_a_stages_own_env_wins(tmplab):
    tmplab.write_profile("cpu", "env:\n  OMP_NUM_THREADS: '1'\n  K: profile\nstages:\n  b:\n    env: {K: stage}\n")
    cfg = load(tmplab, pipeline=PIPELINE.replace("host: local\n    command: [\"true\"]",
                                                 "host: local\n    command: [\"true\"]\n    smoke: {during: a, args: [x]}"),
               profile="cpu")
    assert cfg.stage("a").env == {"OMP_NUM_THREADS": "1", "K": "profile"}
    assert cfg.stage("b").env == {"OMP_NUM_THREADS": "1", "K": "stage"}
    assert cfg.stage("smoke-b").env["OMP_NUM_THREADS"] == "1"  # the smoke runs b's command, in b's env
    assert config.load(tmplab.conf, "test").stage("a").env == {}  # another profile: none of it


@pytest.mark.parametrize("pipeline, needles", [
    (PIPELINE.replace("command: [\"true\"]", "command: [\"true\"]\n    dependz_on: [a]"),
     ["pipeline.yaml", "stages.b.dependz_on", "did you mean 'depends_on'"]),
    (PIPELINE.replace("host: local\n    command: [\"true\"]", "host: local\n    command: [\"true\"]\n    gpus: lots"),
     ["pipeline.yaml", "stages.b.gpus", "'lots'", "integer"]),
    (PIPELINE.replace("host: local\n    command: [\"true\"]", "host: gpu9\n    command: [\"true\"]"),
     ["pipeline.yaml", "stages.b.host", "'gpu9'", "no such host", "lab.yaml"]),
    (PIPELINE.replace("depends_on: [a]", "depends_on: [aa]"), ["stages.b.depends_on", "'aa'", "did you mean 'a'"]),
    (PIPELINE.replace("print(${n})", "print(${m})"), ["stage 'a'", "${m}", "vars"]),
    (PIPELINE + "  c:\n    host: local\n    command: [x]\n    depends_on: [c]\n", ["cycle", "c -> c"]),
    ("stages: [1, 2]\n", ["pipeline.yaml", "stages", "dictionary"]),
    ("stages: {a: {host: local, command: [x]\n", ["pipeline.yaml", "not valid YAML"]),
])
def test_broken_pipeline_names_file_and_key(tmplab, pipeline, needles):
    tmplab.write_pipeline(pipeline)
    with pytest.raises(ConfigError) as e:
        config.load(tmplab.conf)
    for needle in needles:
        assert needle in e.value.message, (needle, e.value.message)


def test_bad_profile_value_is_blamed_on_the_profile_file(tmplab):
    tmplab.write_profile("bad", "stages:\n  a:\n    gpus: -x\n")
    with pytest.raises(ConfigError) as e:
        load(tmplab, profile="bad")
    assert "profiles/bad.yaml: stages.a.gpus" in e.value.message


def test_unknown_profile_lists_profiles(tmplab):
    with pytest.raises(ConfigError) as e:
        load(tmplab, profile="tets")
    assert "no such profile 'tets'" in e.value.message and "did you mean 'test'" in e.value.message


def test_lab_yaml_unknown_host_key(tmplab):
    tmplab.write_lab("    gpu_count: 8\n")
    with pytest.raises(ConfigError) as e:
        load(tmplab)
    assert "lab.yaml: hosts.local.gpu_count" in e.value.message and "allowed:" in e.value.message


def test_repo_conf_and_profiles_are_valid():
    """The shipped config and every shipped profile load."""
    from pathlib import Path
    profiles = sorted(p.stem for p in (config.REPO_ROOT / "conf" / "profiles").glob("*.yaml"))
    assert "demo" in profiles
    for name in profiles:
        cfg = config.load(config.REPO_ROOT / "conf", name)
        assert cfg.stages, name
        assert Path(cfg.logs_dir).name == "logs"


def test_broken_config_launches_nothing(tmplab):
    tmplab.write_pipeline(PIPELINE.replace("command: [\"true\"]", "command: [\"true\"]\n    colour: red"))
    p = tmplab.lab("run", "b", check=False)
    assert p.returncode == 2
    assert "stages.b.colour" in p.stderr and "pipeline.yaml" in p.stderr
    assert tmplab.run_dirs() == []


def test_literal_dollar_stays_literal_beside_substituted_vars(tmplab):
    cfg = load(tmplab, PIPELINE.replace('print(${n})', "print('$$HOME', ${n}) $$(${n})"))
    a = cfg.stage("a")
    assert cfg.render(a, a.command[2], cfg.vars_for(a)) == "print('$HOME', 5) $(5)"


def test_vars_refer_to_vars_and_cycles_are_refused(tmplab):
    cfg = load(tmplab, PIPELINE.replace('n: "5"', 'n: "${m}0"\n  m: "${profile}-"'))
    a = cfg.stage("a")
    assert cfg.render(a, a.command[2], cfg.vars_for(a)) == "print(test-0)"
    with pytest.raises(ConfigError) as e:
        load(tmplab, PIPELINE.replace('n: "5"', 'n: "${m}"\n  m: "${n}"'))
    assert "cycle" in e.value.message and "n -> m -> n" in e.value.message


def test_shell_looking_text_is_inert_data(tmplab):
    cfg = load(tmplab, PIPELINE.replace('n: "5"', "n: '$(rm -rf /) `id` $HOME $1'"))
    a = cfg.stage("a")
    assert cfg.render(a, a.command[2], cfg.vars_for(a)) == "print($(rm -rf /) `id` $HOME $1)"


@pytest.mark.parametrize("stage", ["a/b", "../x", "-rf", "two\nlines", "sp ace", ".hidden"])
def test_a_stage_name_is_a_name(tmplab, stage):
    """Names become run ids, file names and crontab lines: `a/b` used to crash, a newline to add a
    second crontab entry."""
    import json
    pipeline = "stages:\n  " + json.dumps(stage) + ":\n    host: local\n    command: [\"true\"]\n"
    with pytest.raises(ConfigError, match="stage name .* is not allowed") as e:
        load(tmplab, pipeline)
    assert "pipeline.yaml" in str(e.value)


@pytest.mark.parametrize("profile", ["../../etc/x", "a\nb", "/abs"])
def test_a_profile_name_cannot_reach_another_file(tmplab, profile):
    """`--profile ../../x` used to load any YAML file."""
    tmplab.write_pipeline(PIPELINE)
    with pytest.raises(ConfigError, match="profile name .* is not allowed"):
        config.load(tmplab.conf, profile)


def test_a_host_name_is_a_name(tmplab):
    tmplab.write_lab("  bad/host:\n    reach: local\n")
    with pytest.raises(ConfigError, match="host name 'bad/host' is not allowed"):
        load(tmplab)


def test_a_key_given_twice_is_an_error_naming_both_lines(tmplab):
    dup = PIPELINE + "  a:\n    host: local\n    command: [\"false\"]\n"
    with pytest.raises(ConfigError, match=r"pipeline.yaml: .*key 'a' given twice: lines 4 and 11"):
        load(tmplab, dup)


def test_nested_vars_cannot_blow_up(tmplab):
    """520 bytes of YAML with nested ${var}s used to become a 100 MB argument list."""
    lines = ["vars:", '  v0: "xxxxxxxxxxxxxxxx"'] + [f'  v{i}: "${{v{i - 1}}}${{v{i - 1}}}${{v{i - 1}}}${{v{i - 1}}}"'
                                                     for i in range(1, 14)]
    pipeline = "\n".join(lines) + '\nstages:\n  a:\n    host: local\n    command: ["echo", "${v13}"]\n'
    assert len(pipeline) < 1000
    with pytest.raises(ConfigError, match="expands to .* characters"):
        load(tmplab, pipeline)


def test_yaml_aliases_cannot_blow_up(tmplab):
    lol = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lol += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    tmplab.write_pipeline("\n".join(lol) + "\nstages: {}\n")
    with pytest.raises(ConfigError, match="aliases"):
        config.load(tmplab.conf)


def test_a_var_is_a_scalar_and_a_conf_file_is_text(tmplab):
    with pytest.raises(ConfigError, match=r"vars.n is a dict"):
        load(tmplab, PIPELINE.replace('n: "5"', "n: {a: 1}"))
    (tmplab.conf / "pipeline.yaml").write_bytes(b"stages:\n  a: \xff\xfe\n")
    with pytest.raises(ConfigError, match="pipeline.yaml: not UTF-8 text"):
        config.load(tmplab.conf)


# -- the file that holds the key is the one named -----------------------------------------------

@pytest.mark.parametrize("profile, blamed, key", [
    ("stages:\n  b:\n    host: gpu9\n", "profiles/p.yaml", "stages.b.host = 'gpu9'"),
    ("stages:\n  b:\n    depends_on: [zz]\n", "profiles/p.yaml", "stages.b.depends_on: no stage 'zz'"),
    ("stages:\n  a:\n    command: ['${nope}']\n", "profiles/p.yaml", "${nope}"),
    ("stages:\n  a:\n    kind: service\n", "profiles/p.yaml", "a service needs `ready:`"),
    ("vars:\n  n: [1]\n", "profiles/p.yaml", "vars.n is a list"),
    # the profile touches the stage, but the bad key is pipeline.yaml's
    ("stages:\n  b:\n    gpus: 1\n", "pipeline.yaml", "stages.b.host = 'gpu9'"),
    # the profile sets one key of a host, lab.yaml holds the bad one
    ("hosts:\n  local:\n    gpus: 1\n", "lab.yaml", "hosts.local.base_python"),
])
def test_an_error_blames_the_file_that_holds_the_key(tmplab, profile, blamed, key):
    pipeline = PIPELINE
    if blamed == "pipeline.yaml":
        pipeline = PIPELINE.replace("host: local\n    command: [\"true\"]", "host: gpu9\n    command: [\"true\"]")
    if blamed == "lab.yaml":
        tmplab.write_lab("    base_python: [no]\n")
    tmplab.write_profile("p", profile)
    with pytest.raises(ConfigError) as e:
        load(tmplab, pipeline, profile="p")
    msg = e.value.message
    assert key in msg, msg
    named = msg.split(key)[0].rsplit("\n", 1)[-1]  # the text before the key: its file
    assert named.rstrip(": ").endswith(blamed) or f"/{blamed}:" in named, msg
    other = {"profiles/p.yaml": "pipeline.yaml", "pipeline.yaml": "profiles/p.yaml", "lab.yaml": "profiles/p.yaml"}
    assert f"/{other[blamed]}:" not in named, msg


BUDGET = PIPELINE.replace('vars:\n  n: "5"\n', 'vars:\n  n: "5"\n  prompt_max_tokens: "1024"\n'
                          '  synth_max_tokens: "7168"\n  seq_length: "8192"\n  max_model_len: "9216"\n')


def test_a_possible_length_budget_loads(tmplab):
    cfg = load(tmplab, BUDGET)
    assert cfg.pipeline.vars["max_model_len"] == "9216"


@pytest.mark.parametrize("profile_vars, needles", [
    # the seeds' numbers: a response cut at the cap is max_model_len tokens, extraction asks for one more
    ({"synth_max_tokens": "16384", "seq_length": "16384", "max_model_len": "16384"},
     ["seq_length = 16,384 >= max_model_len = 16,384", "raise max_model_len to at least 16,385"]),
    ({"synth_max_tokens": "8192"},
     ["prompt_max_tokens + synth_max_tokens = 9,216 > seq_length = 8,192", "vars.prompt_max_tokens = 1,024",
      "lower synth_max_tokens to 7,168 or raise seq_length to 9,216"]),
    ({"seq_length": "${max_model_len}"}, ["seq_length = 9,216 >= max_model_len = 9,216"]),
    ({"seq_length": "lots"}, ["vars.seq_length = 'lots' is not a whole number"]),
])
def test_an_impossible_length_budget_is_refused_at_load(tmplab, profile_vars, needles):
    tmplab.write_profile("bad", "vars:\n" + "".join(f"  {k}: '{v}'\n" for k, v in profile_vars.items()))
    with pytest.raises(ConfigError) as e:
        load(tmplab, BUDGET, profile="bad")
    msg = e.value.message
    assert "impossible token length budget" in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    for key in profile_vars:  # the key the profile set is blamed on the profile file
        assert f"vars.{key}" in msg and "bad.yaml" in msg, msg


def test_the_repo_profiles_fit_their_length_budget():
    for profile in ("demo", "kimi-k2.5", "none"):
        v = config.load(config.REPO_ROOT / "conf", profile).pipeline.vars
        p, g, s, m = (int(v[k]) for k in ("prompt_max_tokens", "synth_max_tokens", "seq_length", "max_model_len"))
        assert p + g <= s < m, (profile, p, g, s, m)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_in_place_of_a_conf_file_is_refused_not_waited_on(tmplab, kind):
    """O-14: `lab` with a FIFO for pipeline.yaml waited forever (and /dev/zero would be read
    forever); both are refused at once, naming the file and what it is."""
    import os
    import subprocess
    import time
    tmplab.write_pipeline(PIPELINE)
    target = tmplab.conf / "pipeline.yaml"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    started = time.monotonic()
    try:
        p = tmplab.lab("plan", check=False, timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("lab plan waited on the conf file") from None
    took = time.monotonic() - started
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    assert p.returncode != 0 and f"{target}: {what}, not a regular file" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and took < 15, took
