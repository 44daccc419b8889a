"""conf/*.yaml -> validated objects. Every error names the file, the key, the bad value and the fix.

Two files and a profile:
  conf/lab.yaml              hosts (how to reach them, where to work, which python), notifications
  conf/pipeline.yaml         stages (host, command, inputs, outputs, depends_on) and ${vars}
  conf/profiles/NAME.yaml    a partial of both (keys `hosts`, `vars`, `stages`, ...) merged on top,
                             so a profile changes models and sizes without copying the config.

Commands are argv lists (never a shell string); `${var}` is replaced inside each element, so a
value from the config can never become shell syntax.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from . import length_budget, placement, side_jobs
from .errors import ConfigError
from .fsutil import NotAFile, read_regular_file

REPO_ROOT = Path(__file__).resolve().parents[2]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SshConfig(_Strict):
    host: str  # hostname or ~/.ssh/config alias
    user: str | None = None
    port: int | None = None
    options: list[str] = []  # extra `-o Key=Value` strings, passed as separate argv items
    connect_timeout_s: int = 5
    alive_interval_s: int = 5
    alive_count_max: int = 3
    config_file: str | None = None  # an ssh_config to use instead of ~/.ssh/config (`ssh -F`)
    multiplex: bool = True  # one ControlMaster connection per host (socket under logs/ssh/)
    control_persist_s: int = 300  # how long the master outlives the last call
    command_timeout_s: float = 60  # a remote call that takes longer counts as the host not answering


class SlurmOptions(_Strict):
    """sbatch options; the host's `slurm:` block sets them for every stage, a stage's `slurm:` overrides."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # --time, Slurm's format: "MM", "HH:MM:SS", "D-HH:MM"
    cpus: int | None = None  # --cpus-per-task
    mem: str | None = None  # --mem per node: "16G", "500M"
    gpus: int | None = None  # GPUs per node (default: the stage's `gpus`)
    gpu_flag: Literal["gres", "gpus"] | None = None  # --gres=gpu:N (default) or --gpus-per-node=N
    nodes: int | None = None  # >1: srun + torchrun over the nodes, rendezvous on the first
    # allow (or yes): a preempted job or a failed node is requeued (sbatch --requeue) and the stage runs
    # again in its run directory, each start counted (`attempts`); refuse (or no): --no-requeue, and a
    # start Slurm makes anyway (slurmctld restarted without its state) exits at once, running nothing
    requeue: Literal["allow", "refuse"] | None = None
    extra_args: list[str] = []  # more sbatch options, one argv item each ("--constraint=a100")

    @field_validator("requeue", mode="before")
    @classmethod
    def _requeue_words(cls, v):
        return {True: "allow", False: "refuse"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("extra_args")
    @classmethod
    def _options_only(cls, v):
        bad = [a for a in v if not a.startswith("-")]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an sbatch option; write options as --name=value")
        return v

    @field_validator("partition", "account", "qos", "time", "mem")
    @classmethod
    def _no_dash(cls, v):
        if v is not None and (v.startswith("-") or not v.strip()):
            raise ValueError(f"{v!r}: a value may not be empty or start with '-'")
        return v


class SlurmHostConfig(SlurmOptions):
    requeue: Literal["allow", "refuse"] | None = "allow"


class HostConfig(_Strict):
    name: str = ""
    reach: Literal["local", "ssh", "slurm"] = "local"
    ssh: SshConfig | None = None  # required when reach == ssh; with reach: slurm, the login node (else this machine)
    slurm: SlurmHostConfig | None = None  # required when reach == slurm: sbatch defaults; work_dir must be shared
    work_dir: str = "logs/local"  # run directories live in <work_dir>/runs; relative = to repo_dir
    repo_dir: str = "."  # where the project is checked out on the host; relative = this repo
    python: str = ".venv/bin/python"  # interpreter with eaglelab installed; relative = to repo_dir
    gpus: int = 0  # GPUs the stages may use on this host
    lock: str = "requirements.lock"  # the pinned environment the host's venv must match (controller path)
    base_python: str = "python3"  # on the host: the interpreter `lab sync` makes the venv with
    pip_options: list[str] = []  # extra `pip install` arguments for `lab sync` (--index-url, --find-links ...)
    # Data placement (docs/hosts.md, "Several hosts"): path prefixes (as stage paths are written: relative to
    # repo_dir, or absolute) -> the name of the filesystem behind them. Two hosts that give the same
    # name to a prefix of a path see the same files there, so nothing is moved between them.
    shared: dict[str, str] = {}
    # Hosts this host reaches itself with `ssh NAME` (its own keys and ~/.ssh/config): data goes
    # host to host; otherwise it goes through the controller (which reaches every host).
    direct_to: list[str] = []
    # Folders (relative to repo_dir, or absolute) that transfers may write into. A transfer mirrors
    # with rsync --delete, so its destination must lie strictly inside one of these, as resolved
    # on this host (symlinks followed there); anything else is refused before rsync runs.
    data_roots: list[str] = ["data"]
    _logs_dir: str | None = PrivateAttr(None)  # the controller's logs dir, set by load()

    @field_validator("data_roots")
    @classmethod
    def _roots_are_folders(cls, v):
        for r in v:
            if unsafe_root(r):
                raise ValueError(f"{r!r} is not a data root: {unsafe_root(r)}; name a folder that holds "
                                 f"only data, e.g. data or /scratch/eaglelab")
        return v

    @field_validator("ssh")
    @classmethod
    def _ssh_for_ssh(cls, v, info):
        if info.data.get("reach") == "ssh" and v is None:
            raise ValueError("reach: ssh needs an `ssh:` block with at least `host:`")
        return v


def unsafe_root(p: str) -> str | None:
    """Why p cannot be a transfer's data root or destination, read from its text alone (the host
    resolves symlinks later); None if nothing is wrong with it on its face."""
    import posixpath
    if not p.strip():
        return "an empty path is the repository itself"
    if p.startswith("~") and not (p == "~" or p.startswith("~/")):
        return "a ~user path would be expanded on the controller, not on the host"
    n = posixpath.normpath(p)
    if n in (".", "~"):
        return "it is the repository (or home) itself" if n == "." else "it is the home directory itself"
    if n == "/" or n == "//":
        return "it is the root of the filesystem"
    if n == ".." or n.startswith("../"):
        return "it climbs out of the repository (..)"
    return None


def slurm_options(host: HostConfig, stage: StageConfig | None = None) -> dict:
    """The host's sbatch defaults with the stage's overrides; GPUs default to the stage's `gpus`."""
    opts = (host.slurm or SlurmHostConfig()).model_dump()
    if stage is not None:
        if stage.gpus:
            opts["gpus"] = stage.gpus
        if stage.slurm is not None:
            own = stage.slurm.model_dump(exclude_unset=True)
            extra = own.pop("extra_args", [])
            opts.update(own)
            opts["extra_args"] = [*opts.get("extra_args", []), *extra]
    return opts


class WebhookConfig(_Strict):
    url: str | None = None
    url_env: str | None = None  # the URL from this environment variable (keeps the secret out of conf/)
    format: Literal["generic", "slack", "ntfy"] = "generic"
    events: list[Literal["completed", "failed", "stalled", "pipeline_finished", "gate_failed"]] = [
        "completed", "failed", "stalled", "pipeline_finished", "gate_failed"]

    @model_validator(mode="after")
    def _one_url(self):
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give the webhook's `url:` or `url_env:` (the name of an environment variable "
                             "that holds it), one of the two")
        if self.url is not None and webhook_url_problem(self.url):
            raise ValueError(f"url: {webhook_url_problem(self.url)}")
        return self

    def resolved_url(self) -> str:
        if self.url is not None:
            return self.url
        url = os.environ.get(self.url_env or "")
        if not url:
            raise ConfigError(f"notify.webhooks: url_env {self.url_env!r} is not set in this environment "
                              f"(cron jobs see little of your shell's environment: set it in the crontab "
                              f"line or use url:)")
        if webhook_url_problem(url):
            raise ConfigError(f"notify.webhooks: the URL in ${self.url_env}: {webhook_url_problem(url)}")
        return url


def webhook_url_problem(url: str) -> str | None:
    """Why url cannot be a webhook (only http:// and https:// URLs with a host are posted to; a
    file:, ftp: or data: URL would be read or written by urllib), or None. Never echoes the URL:
    its path is the webhook's secret."""
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        return "not a URL; write it as https://HOST/PATH"
    if parts.scheme.lower() not in ("http", "https"):
        return (f"scheme {parts.scheme + ':' if parts.scheme else '(none)'} is not allowed; a webhook is an "
                f"http:// or https:// URL")
    if not host:
        return "no host in the URL; write it as https://HOST/PATH"
    return None


class NotifyConfig(_Strict):
    webhooks: list[WebhookConfig] = []
    status_url: str = "http://127.0.0.1:8765/"


class WebConfig(_Strict):
    host: str = "127.0.0.1"  # the LAN only when asked for
    port: int = 8765
    token_env: str = "EAGLELAB_TOKEN"  # env var holding the bearer token for POST actions
    # Host headers answered besides the bind address, localhost and 127.0.0.1 (the names and
    # addresses LAN users type); any other is refused, so a DNS-rebinding page cannot read the lab
    allowed_hosts: list[str] = []


class TransferOptions(_Strict):
    """How outputs move between hosts that share no filesystem (eaglelab.control.transfers.transfer)."""
    bwlimit: str | None = None  # rsync --bwlimit ("50m" = 50 MiB/s): leave the lab's link some room
    retries: int = 5  # a leg that fails (a cut link) is tried again this many times; then the stage fails
    retry_wait_s: float = 10


class LabConfig(_Strict):
    profile: str = "demo"
    logs_dir: str = "logs"  # controller-side registry, mirrored logs, cron logs
    hosts: dict[str, HostConfig] = Field(min_length=1)
    placement: dict[str, str] = {}  # stage -> host, over the pipeline's and the profile's `host:`
    transfers: TransferOptions = TransferOptions()
    notify: NotifyConfig = NotifyConfig()
    web: WebConfig = WebConfig()


class ReadyConfig(_Strict):
    log_regex: str | None = None  # a service is ready when its log matches ...
    url: str | None = None  # ... or when this URL answers 200
    timeout_s: float = 1800


class PriorConfig(_Strict):
    """A stage's duration before this lab has run it: its input's size x a declared throughput
    (docs/eta.md). Learned rates from finished runs replace it. Values may use ${vars}."""
    unit: Literal["samples", "tokens", "bytes", "lines", "items"]  # what `per_s` counts
    per_s: float = Field(gt=0)  # the throughput: units per second
    measure: str | None = None  # the input whose size is measured on the host (a file or an output dir)
    count: str | None = None  # which counts.<key> of its manifest.json (default: the unit)
    limit: str | float | None = None  # at most this many units (e.g. ${synth_limit}); the size too while
                                      # `measure` is not there yet
    expected: str | float | None = None  # the size while `measure` is not there yet (no cap)
    times: str | float = 1  # passes over the input (training epochs)
    fixed_s: float = Field(0, ge=0)  # time that does not grow with the input (loading the model)
    spread: float = Field(3.0, gt=1)  # the range: /spread .. x spread (a prior is a guess)

    @model_validator(mode="after")
    def _some_size(self):
        if self.measure is None and self.limit is None and self.expected is None:
            raise ValueError("a prior needs a size: `measure:` (an input measured on the host), "
                             "`limit:` or `expected:` (a number of units, or a ${var} holding one)")
        return self


class DuringConfig(_Strict):
    """A side job (docs/foresight.md): `lab pipeline` starts it while `stage` runs, once that run's
    progress has reached `after` units (its bar's n: rows generated, samples extracted), instead of
    in dependency order. `late`: also start it when `stage` had finished already (a pilot still
    forecasts then; a smoke of the next stage would only repeat it)."""
    stage: str
    after: str | int = 1  # units of `stage`'s progress; may be a ${var}
    late: bool = True


class SmokeConfig(_Strict):
    """Try this stage on the first outputs of the stage before it, while that one still runs: eaglelab
    adds the job `smoke-<stage>` = this stage's command + `args` (its own script reads them: train's
    --smoke-steps, serve's --smoke-checkpoints), started `during` that stage after `after` units. A smoke
    that fails is reported at once as this stage's failure, and `lab pipeline` does not start this stage
    (for a service: no job that needs it) with the same config. The smoke of a service is a job too."""
    during: str
    after: str | int = 1
    args: list[str] = Field(min_length=1)  # appended to the command (a later option wins in click)
    env: dict[str, str] = {}


class StageConfig(_Strict):
    name: str = ""
    kind: Literal["job", "service"] = "job"
    host: str
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = {}
    inputs: list[str] = []  # paths (relative to the host's repo_dir) the stage reads
    outputs: list[str] = []  # paths it writes; their manifests feed the next stage's fingerprint
    depends_on: list[str] = []  # jobs that must have completed first
    after: list[str] = []  # jobs `lab pipeline` runs before this one, without needing them (an order only)
    needs: list[str] = []  # services that must be up (ready) while this stage runs
    gpus: int = 0  # GPUs it needs on its host; services holding them are stopped first
    ready: ReadyConfig | None = None  # services only
    stop_grace_s: float = 30  # TERM, then KILL after this long
    slurm: SlurmOptions | None = None  # on a reach: slurm host: this stage's sbatch options (override the host's)
    prior: PriorConfig | None = None  # first-run ETA: input size x throughput (docs/eta.md)
    description: str = ""
    keep_alive_s: float = 600  # services: stopped once no job that needs them has run for this long
    during: DuringConfig | None = None  # a side job started while another stage runs (a pilot)
    smoke: SmokeConfig | None = None  # try this stage on the first outputs of the one before it
    # set for the transfer stages eaglelab adds (eaglelab.control.transfers), never by a user
    _transfer: Any = PrivateAttr(None)
    _smoke_of: str | None = PrivateAttr(None)  # set on the smoke-<stage> jobs eaglelab adds

    @property
    def transfer(self):
        return self._transfer

    @property
    def smoke_of(self) -> str | None:
        return self._smoke_of


class GateConfig(_Strict):
    """Conditions on the pipeline's forecast that a stage needs (docs/foresight.md); eaglelab.control.foresight.gates."""
    min_acceptance_rate: float | None = Field(None, ge=0, le=1)   # the forecast's acceptance rate
    min_mean_acceptance_length: float | None = Field(None, ge=1)
    min_speedup: float | None = Field(None, gt=0)                 # only once a speedup is measured
    max_disagreement: float | None = Field(None, ge=0, le=1)      # |offline - served| acceptance rate
    min_checkpoints: int = Field(2, ge=1)  # offline estimates seen before a checkpoint forecast may fail it


class EngineCheckConfig(_Strict):
    """The engine's drafting path checked while synth runs (docs/foresight.md, "The engine check"): synth's
    server serves the target WITH this drafter, and the job `engine_check` beside synth compares vLLM's own
    acceptance counters with the drafter's offline acceptance on the same rows; a served figure below
    `min_ratio` x the offline one is an engine-path alarm. eaglelab.engine_check_stages adds the stages."""
    drafter: str                       # an EAGLE-3 drafter for this target (speculators format: the offline estimate reads it)
    served_drafter: str = ""           # what vLLM loads, if not `drafter` (a converted copy; the fault replay's altered copy)
    min_ratio: float = Field(0.6, gt=0, le=1)  # served / offline acceptance below this: the alarm
    rows: str | int = 16               # synth rows it checks (the first, in prompt order); it starts once synth made them
    offline_rate: float | None = Field(None, gt=0, le=1)  # a figure measured elsewhere, where the target cannot
                                       # run beside synth's server (Kimi-K2.5): compared instead of computing one
    port: str | int = 8104             # synth's server with the drafter (serve_synth)
    min_drafts: int = Field(20, ge=1)  # fewer drafts counted by vLLM: no judgement (too few to compare)
    output_probe: int = Field(4, ge=0)  # synth prompts through the output probe on serve_synth (does it still
                                       # sample the target's distribution? eaglelab.stages.output_probe); 0: off


class PipelineConfig(_Strict):
    vars: dict[str, Any] = {}
    env: dict[str, str] = {}  # the environment every stage starts with; a stage's own `env:` wins
    stages: dict[str, StageConfig] = Field(min_length=1)
    gates: dict[str, GateConfig] = {}  # stage -> the gate it must pass (before it starts and while it runs)
    engine_check: EngineCheckConfig | None = None  # opt-in: synth served with a known drafter, checked
    # beside: the pilot is a side job beside synth (the demo); own: it runs first, in a window of its own
    # (synth's first rows, serve_extract, its train on a GPU of its own): eaglelab.pilot_window
    pilot_window: Literal["beside", "own"] = "beside"


class Config:
    """The lab, the pipeline and the profile, merged and checked."""

    def __init__(self, lab: LabConfig, pipeline: PipelineConfig, profile: str, conf_dir: Path):
        self.lab, self.pipeline, self.profile, self.conf_dir = lab, pipeline, profile, conf_dir

    # The stages and hosts eaglelab adds itself (side_jobs' smoke tests, placement's transfers) are
    # made through these, so that those modules need not import this one (which imports them).
    @staticmethod
    def make_stage(**fields: Any) -> StageConfig:
        return StageConfig(**fields)

    @staticmethod
    def make_host(**fields: Any) -> HostConfig:
        return HostConfig(**fields)

    @property
    def hosts(self) -> dict[str, HostConfig]:
        return self.lab.hosts

    @property
    def stages(self) -> dict[str, StageConfig]:
        return self.pipeline.stages

    @property
    def logs_dir(self) -> Path:
        return (REPO_ROOT / self.lab.logs_dir).resolve()

    def stage(self, name: str) -> StageConfig:
        if name not in self.stages:
            raise ConfigError(f"no stage {name!r} in {self.conf_dir / 'pipeline.yaml'}"
                              f"{did_you_mean(name, self.stages)}; stages: {', '.join(self.stages)}")
        return self.stages[name]

    def host(self, name: str) -> HostConfig:
        if name not in self.hosts:
            raise ConfigError(f"no host {name!r} in {self.conf_dir / 'lab.yaml'}"
                              f"{did_you_mean(name, self.hosts)}; hosts: {', '.join(self.hosts)}")
        return self.hosts[name]

    def stage_order(self, names: list[str] | None = None) -> list[str]:
        """Stages (all, or these and what they depend on) in dependency order."""
        order: list[str] = []

        def visit(n: str, trail: tuple[str, ...]) -> None:
            if n in order:
                return
            if n in trail:
                raise ConfigError(f"dependency cycle in {self.conf_dir / 'pipeline.yaml'}: "
                                  f"{' -> '.join(trail + (n,))}")
            for d in self.stage(n).depends_on + self.stage(n).needs + self.stage(n).after:
                visit(d, trail + (n,))
            order.append(n)

        for n in names if names is not None else list(self.stages):
            visit(n, ())
        return order

    def vars_for(self, stage: StageConfig, **extra: str) -> dict[str, str]:
        host = self.host(stage.host)
        base = {"profile": self.profile, "stage": stage.name, "host": host.name,
                "repo": host.repo_dir, "python": host.python, "work_dir": host.work_dir}
        base.update({k: str(v) for k, v in self.pipeline.vars.items()})
        base.update(extra)
        return base

    def render(self, stage: StageConfig, value: str, variables: dict[str, str]) -> str:
        return render_template(value, variables, f"stage {stage.name!r} in {self.conf_dir / 'pipeline.yaml'}")


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def render_template(value: str, variables: dict[str, str], where: str) -> str:
    """Replace ${var} and $var once; a var's own value may use other vars (resolved first, cycles
    refused). `$$` is a literal `$`; any other `$` (`$(...)`, `$1`, an unknown bare `$HOME`) stays as
    written, so shell-looking text is inert data. An unknown ${var} is a ConfigError naming where."""
    return _substitute(value, _ResolvedVars(variables, where), where)


_VAR_TOKEN = re.compile(r"\$(?:(\$)|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class _ResolvedVars:
    """Each var rendered (once, lazily) before it is used."""

    def __init__(self, raw: dict[str, str], where: str):
        self.raw, self.where, self.done, self.active = raw, where, {}, []

    def get(self, name: str) -> str | None:
        if name not in self.done:
            if name not in self.raw:
                return None
            if name in self.active:
                raise ConfigError(f"{self.where}: variables refer to each other in a cycle: "
                                  f"{' -> '.join(self.active + [name])}")
            self.active.append(name)
            self.done[name] = _substitute(str(self.raw[name]), self, f"{self.where} (var {name!r})")
            self.active.pop()
        return self.done[name]


def _substitute(value: str, variables: _ResolvedVars, where: str) -> str:
    def one(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) if m.group(2) is not None else m.group(3)
        resolved = variables.get(name)
        if resolved is not None:
            return resolved
        if m.group(2) is not None:  # ${name}: surely meant as a variable
            hint = f"{did_you_mean(name, variables.raw)}; define it under `vars:`"
            raise ConfigError(f"{where}: unknown variable ${{{name}}} in {value!r}{hint}",
                              public=f"{where}: unknown variable ${{{name}}}{hint}")
        return m.group(0)  # $word that is no variable: literal text

    out = _VAR_TOKEN.sub(one, value)
    if len(out) > MAX_EXPANDED:  # nested ${var}s grow exponentially: 520 bytes once made 100 MB
        raise ConfigError(f"{where}: {value[:60]!r}... expands to {len(out):,} characters (at most "
                          f"{MAX_EXPANDED:,}); check the `vars:` that refer to each other")
    return out


MAX_EXPANDED = 64 * 1024     # characters in one rendered value (an argv item, an env value)
MAX_YAML_NODES = 100_000     # values in a file once its aliases are expanded (no "billion laughs")


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """safe_load that refuses a key given twice in one mapping (the second silently replaced the
    first: a whole stage vanished that way), naming both lines. libyaml's parser where PyYAML has
    it (the lock's wheel does): 10x less CPU than the pure-Python one, which every `lab` call paid."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice: lines {seen[key] + 1} and {key_node.start_mark.line + 1}",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _expanded_size(data: Any, memo: dict | None = None) -> int:
    """How many values data holds with every alias expanded (shared objects counted each time)."""
    memo = {} if memo is None else memo
    if id(data) in memo:
        return memo[id(data)]
    n = 1
    if isinstance(data, dict):
        n += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in data.items())
    elif isinstance(data, list):
        n += sum(_expanded_size(v, memo) for v in data)
    memo[id(data)] = n
    return n


def _load_yaml(path: Path) -> dict:
    try:
        text = read_regular_file(path).decode()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found (copy it from the repository's conf/)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except NotAFile as e:  # a FIFO would be waited on forever, /dev/zero read forever: refused
        raise ConfigError(f"{path}: {e}; put the YAML file itself there") from None
    except OSError as e:  # a directory, no permission
        raise ConfigError(f"{path}: cannot be read as a file ({e.strerror or e})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a (C)SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None)
        # the terminal gets YAML's own message with the line's text; the page only where, and what
        raise ConfigError(f"{path}: not valid YAML: {e}",
                          public=f"{path}: not valid YAML{where}" + (f": {problem}" if problem else "")
                          + "; run `lab plan` for the details") from None
    if "&" in text and _expanded_size(data) > MAX_YAML_NODES:  # no anchor (&), no alias to expand
        raise ConfigError(f"{path}: expands to over {MAX_YAML_NODES:,} values through its aliases (&/*); "
                          f"write the values out, or use fewer nested aliases")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _depth(data: Any, loc: tuple) -> int:
    """How many leading parts of loc the data holds (`stages.train.host` in a file: 3)."""
    for n, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return n
    return len(loc)


def key_file(loc: tuple, files: list[Path], sections: list[dict]) -> Path:
    """The file that holds the key at loc. Of files holding the whole key, the last (the profile:
    its value wins the merge); for a key none holds (missing), the one holding the most of its
    path (the stage or host it belongs to), the first of equals (where that was defined)."""
    depths = [_depth(sec, loc) for sec in sections]
    whole = [i for i, d in enumerate(depths) if d == len(loc)]
    if whole:
        return files[whole[-1]]
    return files[max(range(len(files)), key=lambda i: (depths[i], -i))]


def _validate(model: type[BaseModel], data: dict, files: list[Path], sections: list[dict]):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(p) for p in loc) or "(top level)"
            file = key_file(loc, files, sections)
            bad = err.get("input")
            hint = err["msg"]
            if err["type"] == "extra_forbidden":
                parent = model
                allowed = _allowed_keys(model, loc[:-1])
                hint = (f"unknown key{did_you_mean(str(loc[-1]), allowed)}; allowed: {', '.join(allowed)}"
                        if allowed else "unknown key")
                del parent
            shown = "" if err["type"] in ("missing", "extra_forbidden") or not _showable(loc, bad) else f" = {bad!r}"
            lines.append(f"{file}: {key}{shown}: {hint}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


SECRET_KEYS = {"env", "notify"}  # stage env: values and webhook URLs are secrets (docs/operations.md, "Secrets")


def _showable(loc: tuple, value) -> bool:
    """May an error quote this value? Plain scalars outside the secret-bearing keys only: an error
    reaches terminals, cron logs and the status page's banner (O-4)."""
    scalar = value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 200)
    return scalar and not SECRET_KEYS & {str(p) for p in loc}


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed at loc (walking through dict-of-model fields)."""
    current: Any = model
    i = 0
    while i < len(loc):
        fields = getattr(current, "model_fields", None)
        if fields is None or loc[i] not in fields:
            return []
        ann = fields[loc[i]].annotation
        args = getattr(ann, "__args__", ())
        if args and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            current, i = args[1], i + 2  # dict[str, Model]: skip the user's name
        else:
            inner = [a for a in (args or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
            if not inner:
                return []
            current, i = inner[0], i + 1
    return sorted(getattr(current, "model_fields", {}))


PROFILE_KEYS = {"hosts", "vars", "env", "stages", "notify", "web", "description", "gates", "engine_check",
                "pilot_window"}


class _Where:
    """Where an error is, worked out only when one is raised: finding the file that holds a key
    walks the merged files, ~350 times for nothing on every load of a valid config."""

    def __init__(self, fn):
        self.fn = fn

    def __str__(self) -> str:
        return self.fn()

    def __format__(self, spec: str) -> str:
        return format(self.fn(), spec)


def check_name(kind: str, name: object, where: str | _Where) -> None:
    """Host, stage and profile names become file names, run ids and crontab lines: letters, digits,
    `_`, `.`, `-`, starting with a letter or digit (so no `/`, `..`, newline or option-like `-x`)."""
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name) or len(name) > 64:
        raise ConfigError(f"{where}: {kind} name {name!r} is not allowed; use letters, digits, `_`, `.` "
                          f"and `-` (at most 64, starting with a letter or digit)")


def _check_length_budget(variables: dict[str, Any], where) -> None:
    """prompt + generation <= seq_length < max_model_len (eaglelab.length_budget), on the rendered vars."""
    raw = {k: str(v) for k, v in variables.items()}
    values = {}
    for k in length_budget.KEYS:
        if k in raw:
            try:
                values[k] = render_template(raw[k], raw, f"vars.{k}")
            except ConfigError:
                continue  # refers to a built-in (${host}...): the command renders it, nothing to check here
    found = length_budget.problems(values, lambda k: str(where(k)))
    if found:
        raise ConfigError("impossible token length budget (prompt_max_tokens + synth_max_tokens <= seq_length "
                          "< max_model_len):\n  " + "\n  ".join(found))


def load(conf_dir: str | os.PathLike | None = None, profile: str | None = None) -> Config:
    """Load conf_dir (default $EAGLELAB_CONF or <repo>/conf) with a profile merged on top."""
    conf_dir = Path(conf_dir or os.environ.get("EAGLELAB_CONF") or REPO_ROOT / "conf").resolve()
    lab_file, pipe_file = conf_dir / "lab.yaml", conf_dir / "pipeline.yaml"
    lab_raw, pipe_raw = _load_yaml(lab_file), _load_yaml(pipe_file)
    profile = profile or os.environ.get("EAGLELAB_PROFILE") or lab_raw.get("profile") or "demo"
    check_name("profile", profile, f"the profile (--profile, EAGLELAB_PROFILE or {lab_file}: profile)")
    prof_raw: dict = {}
    prof_file = conf_dir / "profiles" / f"{profile}.yaml"
    if profile != "none":
        if not prof_file.exists():
            have = sorted(p.stem for p in (conf_dir / "profiles").glob("*.yaml"))
            raise ConfigError(f"{prof_file}: no such profile {profile!r}{did_you_mean(profile, have)}; "
                              f"profiles: {', '.join(have) or '(none)'}")
        prof_raw = _load_yaml(prof_file)
        unknown = set(prof_raw) - PROFILE_KEYS
        if unknown:
            raise ConfigError(f"{prof_file}: unknown key(s) {', '.join(sorted(unknown))}; "
                              f"a profile may set: {', '.join(sorted(PROFILE_KEYS))}")
    prof_lab = {k: prof_raw[k] for k in ("hosts", "notify", "web") if k in prof_raw}
    prof_pipe = {k: prof_raw[k] for k in ("vars", "env", "stages", "gates", "engine_check", "pilot_window")
                 if k in prof_raw}
    lab = _validate(LabConfig, _deep_merge(lab_raw, prof_lab), [lab_file, prof_file], [lab_raw, prof_lab])
    pipe = _validate(PipelineConfig, _deep_merge(pipe_raw, prof_pipe), [pipe_file, prof_file],
                     [pipe_raw, prof_pipe])
    lab_files, pipe_files = [lab_file, prof_file], [pipe_file, prof_file]
    lab_at = lambda *loc: key_file(loc, lab_files, [lab_raw, prof_lab])  # the file holding a key
    pipe_at = lambda *loc: key_file(loc, pipe_files, [pipe_raw, prof_pipe])
    for name in lab.hosts:
        check_name("host", name, _Where(lambda name=name: f"{lab_at('hosts', name)}: hosts"))
    for name in pipe.stages:
        check_name("stage", name, _Where(lambda name=name: f"{pipe_at('stages', name)}: stages"))
    for name, h in lab.hosts.items():
        h.name = name
        if h.reach == "slurm" and h.slurm is None:
            h.slurm = SlurmHostConfig()
        h._logs_dir = str((REPO_ROOT / lab.logs_dir).resolve())
    for name, host in lab.placement.items():  # lab.yaml puts stages on this lab's hosts
        if name not in pipe.stages:
            raise ConfigError(f"{lab_file}: placement.{name}: no stage {name!r}{did_you_mean(name, pipe.stages)}; "
                              f"stages: {', '.join(pipe.stages)}")
        if host not in lab.hosts:
            raise ConfigError(f"{lab_file}: placement.{name} = {host!r}: no such host{did_you_mean(host, lab.hosts)}; "
                              f"hosts: {', '.join(lab.hosts)}")
        pipe.stages[name].host = host
    for name, s in pipe.stages.items():
        s.name = name
        s.env = {**pipe.env, **s.env}

        def where(key: str, stage: str = name) -> str:
            return f"{pipe_at('stages', stage, key)}: stages.{stage}.{key}"
        if s.host not in lab.hosts:
            raise ConfigError(f"{where('host')} = {s.host!r}: no such host in {lab_file}"
                              f"{f' or {prof_file}' if prof_lab.get('hosts') else ''}"
                              f"{did_you_mean(s.host, lab.hosts)}; hosts: {', '.join(lab.hosts)}")
        for key in ("depends_on", "needs", "after"):
            for d in getattr(s, key):
                if d not in pipe.stages:
                    raise ConfigError(f"{where(key)}: no stage {d!r}{did_you_mean(d, pipe.stages)}")
        for d in s.needs:
            if pipe.stages[d].kind != "service":
                raise ConfigError(f"{where('needs')}: {d!r} is a job; list jobs under depends_on")
        for key in ("during", "smoke"):
            trigger = getattr(s, key)
            ref = None if trigger is None else trigger.stage if key == "during" else trigger.during
            if ref is not None and (ref not in pipe.stages or pipe.stages[ref].kind != "job" or ref == name):
                raise ConfigError(f"{where(key)}: {ref!r} is no other job of the pipeline"
                                  f"{did_you_mean(ref, pipe.stages)}; name the job it runs beside")
        if s.kind == "service" and s.during:  # a service's smoke is a job (smoke-<service>); a service is not
            raise ConfigError(f"{where('during')}: stages.{name} is a service; only a job can run beside another "
                              "stage (a service can have `smoke:`: eaglelab runs its command + args as a job)")
        if s.kind == "service" and s.ready is None:
            raise ConfigError(f"{pipe_at('stages', name, 'kind')}: stages.{name}: a service needs `ready:` "
                              f"(log_regex or url)")
    for name in pipe.gates:
        if name not in pipe.stages:
            raise ConfigError(f"{pipe_at('gates', name)}: gates.{name}: no stage {name!r}"
                              f"{did_you_mean(name, pipe.stages)}; a gate is keyed by the stage it guards")
    for k, v in pipe.vars.items():
        if isinstance(v, (dict, list)) or v is None:
            raise ConfigError(f"{pipe_at('vars', k)}: vars.{k} is a {type(v).__name__}; a var is a string or a "
                              f"number (it is substituted into command lines)")
    for name, h in lab.hosts.items():
        for other in h.direct_to:
            if other not in lab.hosts:
                raise ConfigError(f"{lab_at('hosts', name, 'direct_to')}: hosts.{name}.direct_to: no host {other!r}"
                                  f"{did_you_mean(other, lab.hosts)}")
    _check_length_budget(pipe.vars, lambda k: pipe_at("vars", k))
    cfg = Config(lab, pipe, profile, conf_dir)
    from . import engine_check_stages  # serve_synth + engine_check, before their ${vars} are checked
    engine_check_stages.add(cfg, pipe_at("engine_check") if pipe.engine_check else None)
    from . import pilot_window  # synth_head + pilot_data, after the engine check (which it moves to synth_head)
    pilot_window.add(cfg, pipe_at("pilot_window"))
    for s in pipe.stages.values():  # unknown ${vars}, before placement renders them; blamed on their file
        variables = cfg.vars_for(s)
        for key in ("command", "env", "inputs", "outputs"):
            value = getattr(s, key)
            for v in value.values() if isinstance(value, dict) else value:
                render_template(v, variables, _Where(lambda s=s, key=key: f"stage {s.name!r} in "
                                                                          f"{pipe_at('stages', s.name, key)}"))
    side_jobs.add_smoke_stages(cfg)  # the smoke tests and the transfers this placement needs: stages of their own
    placement.add_transfer_stages(cfg)
    cfg.stage_order()  # refuses cycles now, not at launch
    for s in pipe.stages.values():
        if s.prior is not None:
            prior_numbers(cfg, s, prof_file if name_in(prof_pipe, s.name, "prior") else pipe_file)
    return cfg


def name_in(section: dict, stage: str, key: str) -> bool:
    return isinstance((section.get("stages") or {}).get(stage), dict) and key in section["stages"][stage]


def prior_numbers(cfg: Config, stage: StageConfig, file: Path | None = None) -> dict:
    """The prior's ${var} fields rendered to numbers: {measure, limit, expected, times}; a field that
    is no number is a ConfigError naming the file and the key."""
    p = stage.prior
    assert p is not None
    variables = cfg.vars_for(stage)
    out: dict[str, Any] = {"measure": cfg.render(stage, p.measure, variables) if p.measure else None}
    for key in ("limit", "expected", "times"):
        raw = getattr(p, key)
        if raw is None:
            out[key] = None
            continue
        text = cfg.render(stage, str(raw), variables)
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ConfigError(f"{file or cfg.conf_dir / 'pipeline.yaml'}: stages.{stage.name}.prior.{key} = {raw!r} "
                              f"(-> {text!r}): must be a positive number, or a ${{var}} holding one")
        out[key] = value
    return out
