"""wagma_rl.config: dataclass schemas from YAML with dot-key overrides, checked keys and types."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

import pytest

import yaml

from wagma_rl.config import (ConfigError, config_to_dict, field_docs, format_config, load_config,
                             parse_overrides, save_config)


@dataclass
class Inner:
    lr: float = 2.5e-4
    """learning rate"""
    epochs: int = 2
    """PPO epochs"""
    mode: Literal["wagma", "preempt"] = "wagma"
    """strategy"""


@dataclass
class Outer:
    name: str = "run"
    """run name"""
    seed: int = 0
    """seed"""
    cuda: bool = False
    """use CUDA"""
    path: Optional[str] = None
    """optional path"""
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    """a list"""
    inner: Inner = field(default_factory=Inner)
    """a section"""


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


class TestLoad:
    def test_defaults_when_no_file(self):
        assert load_config(Outer) == Outer()

    def test_yaml_file_sets_nested_values_and_keeps_other_defaults(self, tmp_path):
        cfg = load_config(Outer, write(tmp_path, "seed: 3\ninner:\n  epochs: 4\n"))
        assert (cfg.seed, cfg.inner.epochs, cfg.inner.lr) == (3, 4, 2.5e-4)

    def test_overrides_apply_after_the_file(self, tmp_path):
        cfg = load_config(Outer, write(tmp_path, "seed: 3\n"), ["seed=5", "inner.lr=1e-3",
                                                                 "inner.mode=preempt", "cuda=true"])
        assert (cfg.seed, cfg.inner.lr, cfg.inner.mode, cfg.cuda) == (5, 1e-3, "preempt", True)

    def test_yaml_exponent_without_dot_reads_as_float(self, tmp_path):
        assert load_config(Outer, write(tmp_path, "inner:\n  lr: 3e-4\n")).inner.lr == 3e-4

    def test_int_accepted_for_float_and_list_parsed(self):
        cfg = load_config(Outer, None, ["inner.lr=1", "sizes=[3,4,5]", "path=/x"])
        assert (cfg.inner.lr, cfg.sizes, cfg.path) == (1.0, [3, 4, 5], "/x")


class TestErrors:
    def test_unknown_top_level_key_names_it_and_lists_valid_keys(self, tmp_path):
        with pytest.raises(ConfigError) as err:
            load_config(Outer, write(tmp_path, "sed: 1\n"))
        assert "'sed'" in str(err.value) and "seed" in str(err.value) and "inner" in str(err.value)

    def test_unknown_nested_override_names_full_key(self):
        with pytest.raises(ConfigError, match=r"'inner\.epoch'.*epochs"):
            load_config(Outer, None, ["inner.epoch=3"])

    def test_wrong_type_names_key(self):
        with pytest.raises(ConfigError, match=r"'inner\.epochs'.*integer"):
            load_config(Outer, None, ["inner.epochs=two"])

    def test_bool_is_not_an_int(self):
        with pytest.raises(ConfigError, match="'seed'"):
            load_config(Outer, None, ["seed=true"])

    def test_literal_choice_checked(self):
        with pytest.raises(ConfigError, match=r"'inner\.mode'.*wagma"):
            load_config(Outer, None, ["inner.mode=ring"])

    def test_override_without_equals_is_rejected(self):
        with pytest.raises(ConfigError, match="key=value"):
            load_config(Outer, None, ["seed"])

    def test_missing_file_is_a_config_error(self, tmp_path):
        with pytest.raises(ConfigError, match="not found"):
            load_config(Outer, tmp_path / "nope.yaml")

    def test_section_given_a_scalar_is_rejected(self):
        with pytest.raises(ConfigError, match="'inner'"):
            load_config(Outer, None, ["inner=3"])


@dataclass
class Renamed:
    RENAMED_VALUES: ClassVar[dict[str, dict[str, str]]] = {"mode": {"ring": "gossip"}}

    mode: Literal["wagma", "gossip"] = "wagma"
    """strategy"""


class TestRenamedValues:
    @pytest.mark.parametrize("source", ["file", "override"])
    def test_an_old_value_is_refused_naming_the_new_one(self, tmp_path, source):
        args = (write(tmp_path, "mode: ring\n"), ()) if source == "file" else (None, ["mode=ring"])
        with pytest.raises(ConfigError, match=r"^config key 'mode': 'ring' has been renamed: use "
                                              r"mode=gossip \(edit the config file"):
            load_config(Renamed, *args)

    def test_the_new_value_loads(self):
        assert load_config(Renamed, None, ["mode=gossip"]).mode == "gossip"


def test_saved_config_reloads_equal(tmp_path):
    cfg = load_config(Outer, None, ["seed=9", "inner.mode=preempt", "sizes=[7]"])
    path = save_config(cfg, tmp_path / "run" / "config.yaml")
    assert load_config(Outer, path) == cfg


@dataclass
class Derived(Inner):
    extra: int = 1
    """an added key"""
    undocumented: int = 2


class TestFormat:
    def test_printed_config_is_the_saved_yaml(self, tmp_path):
        cfg = load_config(Outer, None, ["seed=9", "inner.lr=1e-3"])
        assert format_config(cfg) == save_config(cfg, tmp_path / "config.yaml").read_text()

    def test_explained_config_parses_as_the_same_config(self):
        cfg = load_config(Outer, None, ["seed=9", "inner.mode=preempt", "sizes=[7]"])
        assert yaml.safe_load(format_config(cfg, explain=True)) == config_to_dict(cfg)

    def test_explained_config_puts_each_docstring_above_its_key(self):
        text = format_config(load_config(Outer, None, ["inner.epochs=3"]), explain=True)
        assert "# a section\ninner:\n  # learning rate\n  lr: 0.00025\n  # PPO epochs\n  epochs: 3\n" \
            in text

    def test_field_docs_include_inherited_fields_and_leave_out_undocumented_ones(self):
        assert field_docs(Derived) == {"lr": "learning rate", "epochs": "PPO epochs",
                                       "mode": "strategy", "extra": "an added key"}


def test_parse_overrides_nests_dotted_keys():
    assert parse_overrides(["a.b=1", "a.c=x", "d=0.5"]) == {"a": {"b": 1, "c": "x"}, "d": 0.5}


def test_a_float_looking_string_is_read_by_the_fields_type(tmp_path):
    # YAML 1.1 reads 1e-3 as a string: a number field takes it as a number, a string field as typed.
    cfg = load_config(Outer, None, ["name=2e3", "path=1e-3", "inner.lr=1e-3", "seed=1e3"])
    assert (cfg.name, cfg.path, cfg.inner.lr, cfg.seed) == ("2e3", "1e-3", 1e-3, 1000)
    cfg = load_config(Outer, write(tmp_path, "name: 5e2\ninner:\n  lr: 3e-4\n"))
    assert (cfg.name, cfg.inner.lr) == ("5e2", 3e-4)
