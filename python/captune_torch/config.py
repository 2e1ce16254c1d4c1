"""A run's config.toml: a `[model]` and a `[train]` table, and the data
record `[features]`, as captune reads and writes it. Read with tomllib;
written back key by key with the values' types kept, so captune reads
the same config (it refuses unknown keys: only keys it wrote are kept)."""

import json
import math

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A config or command line this package cannot train with; the
    message names the key and what to do."""


def read_config(path, missing):
    """The TOML at `path`; `missing` says what to do where there is none."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config; {missing}")
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})")


def check_train(train, path):
    """Refuses a [train] table without the keys a run needs, or with
    values out of their range."""
    for key, kind, ok, want in (
            ("objective", str, lambda v: True, "an objective's name"),
            ("epochs", int, lambda v: v > 0, "a whole number above 0"),
            ("batch", int, lambda v: v > 0, "a whole number of images above 0"),
            ("lr", (int, float), lambda v: v > 0 and math.isfinite(v), "a rate above 0"),
            ("warmup", int, lambda v: v >= 0, "a whole number of steps"),
            ("weight_decay", (int, float), lambda v: v >= 0, "a number, at least 0"),
            ("log_every", int, lambda v: v > 0, "a whole number of steps above 0"),
            ("seed", int, lambda v: v >= 0, "a whole number")):
        if key not in train:
            raise ConfigError(f"{path}: [train] has no {key} ({want})")
        value = train[key]
        if isinstance(value, bool) or not isinstance(value, kind) or not ok(value):
            raise ConfigError(f"{path}: [train] {key} = {value!r}; expected {want}")


def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"config value {v} is not finite")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise ConfigError(f"config value {v!r} has a type TOML tables here do not take")


def write_config(config):
    """The TOML text of a config of tables (nested tables become [a.b])."""
    lines = []

    def table(name, t):
        scalars = {k: v for k, v in t.items() if not isinstance(v, dict)}
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {value(v)}" for k, v in scalars.items())
        for k, v in t.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)

    for name, t in config.items():
        table(name, t)
    return "\n".join(lines) + "\n"
