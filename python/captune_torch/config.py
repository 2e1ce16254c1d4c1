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


def read_config(path):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such config; give a captune run folder (it holds config.toml) or --config FILE")
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})")


def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"config value {v} is not finite")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise ValueError(f"config value {v!r} has a type TOML tables here do not take")


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
