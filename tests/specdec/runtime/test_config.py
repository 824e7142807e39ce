"""specdec/runtime/config.py: dataclass fields as flags and SPECDEC_* variables; a flag beats the variable, which beats
the default; a bad value is a usage error (exit 2 and one message), never a traceback."""

from __future__ import annotations

import dataclasses

import pytest

from draft_service.config import DraftConfig
from gateway.config import GatewayConfig
from specdec.runtime import config
from specdec.runtime.config import ServerConfig, option
from verifier_service.config import VerifierConfig


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Knobs for the tests"""

    threads: int = option(2, "worker threads")
    ratio: float = option(0.5, "a fraction")
    dtype: str = option("float32", "weights dtype", choices=["float32", "bfloat16"])
    verbose: bool = option(False, "say more")
    model_dir: str = option("", "where the model is")


@dataclasses.dataclass(frozen=True)
class Other:
    """A second group"""

    port: int = option(0, "a port")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No SPECDEC_* variable from the surrounding shell leaks into these tests."""
    for config_type in (Knobs, Other, ServerConfig):
        for field in dataclasses.fields(config_type):
            monkeypatch.delenv(config.env_name(field.name), raising=False)


def parse_knobs(*argv: str, defaults: dict | None = None) -> Knobs:
    (knobs,) = config.parse([Knobs], "test", list(argv), defaults=defaults, prog="knobs")
    return knobs


def usage_error(capsys, *argv: str) -> str:
    """Parse argv expecting a usage error; return what was printed."""
    with pytest.raises(SystemExit) as exit_info:
        parse_knobs(*argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: knobs") and "Traceback" not in err
    return err


def test_names():
    assert config.flag_name("model_dir") == "--model-dir"
    assert config.env_name("model_dir") == "SPECDEC_MODEL_DIR"


def test_defaults_when_nothing_is_set():
    assert parse_knobs() == Knobs(threads=2, ratio=0.5, dtype="float32", verbose=False, model_dir="")


def test_flag_beats_env_beats_default(monkeypatch):
    monkeypatch.setenv("SPECDEC_THREADS", "4")
    monkeypatch.setenv("SPECDEC_MODEL_DIR", "/from/env")
    assert parse_knobs().threads == 4  # env beats the default, converted to int
    knobs = parse_knobs("--threads", "8")
    assert knobs.threads == 8 and knobs.model_dir == "/from/env"  # the flag beats the env; others still read


def test_service_defaults_sit_between_the_field_default_and_the_env(monkeypatch):
    assert parse_knobs(defaults={"ratio": 0.25, "not_a_field": 1}).ratio == 0.25
    monkeypatch.setenv("SPECDEC_RATIO", "0.75")
    assert parse_knobs(defaults={"ratio": 0.25}).ratio == 0.75
    assert parse_knobs("--ratio", "0.125", defaults={"ratio": 0.25}).ratio == 0.125


def test_types_come_from_the_annotations():
    knobs = parse_knobs("--threads", "3", "--ratio", "1e-3", "--model-dir", "12")
    assert (knobs.threads, knobs.ratio, knobs.model_dir) == (3, 0.001, "12")
    assert type(knobs.threads) is int and type(knobs.ratio) is float and type(knobs.model_dir) is str


@pytest.mark.parametrize("text, value", [("true", True), ("TRUE", True), ("yes", True), ("1", True), ("on", True),
                                         ("false", False), ("No", False), ("0", False), ("off", False)])
def test_bool_values_from_flag_and_env(monkeypatch, text, value):
    assert parse_knobs("--verbose", text).verbose is value
    monkeypatch.setenv("SPECDEC_VERBOSE", text)
    assert parse_knobs().verbose is value
    assert parse_knobs("--verbose", str(not value)).verbose is (not value)  # the flag still wins


def test_a_bare_bool_flag_means_true(monkeypatch):
    """`--insecure` as the issue writes it, not only `--insecure true`."""
    assert parse_knobs("--verbose").verbose is True
    assert parse_knobs("--verbose", "--threads", "3") == Knobs(threads=3, verbose=True)
    monkeypatch.setenv("SPECDEC_VERBOSE", "false")
    assert parse_knobs("--verbose").verbose is True


def test_an_empty_bool_variable_is_false(monkeypatch):
    monkeypatch.setenv("SPECDEC_VERBOSE", "")
    assert parse_knobs().verbose is False


def test_choices_are_enforced_on_flags(capsys):
    assert parse_knobs("--dtype", "bfloat16").dtype == "bfloat16"
    err = usage_error(capsys, "--dtype", "float16")
    assert "argument --dtype: invalid choice: 'float16'" in err


def test_choices_are_enforced_on_env(monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_DTYPE", "bfloat16")
    assert parse_knobs().dtype == "bfloat16"
    monkeypatch.setenv("SPECDEC_DTYPE", "float16")
    err = usage_error(capsys)
    assert "SPECDEC_DTYPE='float16': choose from float32, bfloat16" in err


def test_a_good_flag_overrides_a_bad_env(monkeypatch):
    monkeypatch.setenv("SPECDEC_DTYPE", "float16")
    monkeypatch.setenv("SPECDEC_THREADS", "many")
    knobs = parse_knobs("--dtype", "float32", "--threads", "1")
    assert (knobs.dtype, knobs.threads) == ("float32", 1)


@pytest.mark.parametrize("argv, message", [
    (["--threads", "many"], "argument --threads: invalid int value: 'many'"),
    (["--ratio", "half"], "argument --ratio: invalid float value: 'half'"),
    (["--verbose", "maybe"], "argument --verbose: expected true/false, got 'maybe'"),
    (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
])
def test_bad_flags_are_usage_errors(capsys, argv, message):
    assert message in usage_error(capsys, *argv)


@pytest.mark.parametrize("variable, raw, message", [
    ("SPECDEC_THREADS", "many", "SPECDEC_THREADS='many': invalid literal for int()"),
    ("SPECDEC_RATIO", "half", "SPECDEC_RATIO='half': could not convert string to float"),
    ("SPECDEC_VERBOSE", "maybe", "SPECDEC_VERBOSE='maybe': expected true/false, got 'maybe'"),
])
def test_bad_env_values_are_usage_errors_that_name_the_variable(monkeypatch, capsys, variable, raw, message):
    monkeypatch.setenv(variable, raw)
    assert message in usage_error(capsys)


def test_several_groups_parse_from_one_command_line(monkeypatch):
    monkeypatch.setenv("SPECDEC_PORT", "7")
    knobs, other = config.parse([Knobs, Other], "test", ["--threads", "5"], prog="knobs")
    assert knobs.threads == 5 and other == Other(port=7)


def test_server_config(monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_TLS_REQUIRE_CLIENT_CERT", "false")
    (server,) = config.parse([ServerConfig], "test", ["--port", "50051", "--log-level", "DEBUG"])
    assert (server.port, server.log_level, server.tls_require_client_cert) == (50051, "DEBUG", False)
    assert server.grace_s == ServerConfig().grace_s
    with pytest.raises(SystemExit) as exit_info:
        config.parse([ServerConfig], "test", ["--log-level", "LOUD"])
    assert exit_info.value.code == 2 and "invalid choice: 'LOUD'" in capsys.readouterr().err


@pytest.mark.parametrize("service_config", [GatewayConfig, DraftConfig, VerifierConfig])
def test_every_service_prints_its_help(capsys, service_config):
    with pytest.raises(SystemExit) as exit_info:
        config.parse([ServerConfig, service_config], "a service", ["--help"], prog="service")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(ServerConfig) + dataclasses.fields(service_config):
        assert config.flag_name(field.name) in out and config.env_name(field.name) in out


@pytest.mark.parametrize("module", ["bench.studies.speedup", "bench.studies.pipeline", "bench.studies.load", "bench.replay.advise"])
def test_a_bench_tool_refuses_a_wrong_model_directory_in_one_line(module, tmp_path, capsys):
    import importlib

    main = importlib.import_module(module).main
    flag = "--target" if module == "bench.replay.advise" else "--model"
    for path, says in [(tmp_path / "missing", "is not a directory"), (tmp_path, "has no config.json")]:
        argv = [flag, str(path)] + (["--prompts", "p.jsonl"] if module == "bench.replay.advise" else [])
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert says in err and "make model" in err and "Traceback" not in err
