"""Config fields given on the command line (`autopar launch --config
KEY=VALUE`, and --run-option, --stall-timeout... for the common ones): read
into values, checked by Config itself, carried to every process of the job in
AUTOPAR_CONFIG, and applied over the Config the script passes to get_runner,
so the script, its report run and every worker run with the same one."""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from autopar.common import env
from autopar.common.errors import AutoparError, shown
from autopar.config import Config


def parse(setting: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as (key, value): VALUE as a Python literal (``5``,
    ``None``, ``True``, ``(5, 50)``, ``{'embedding': 8}``), else as the text
    itself (``ps``, a path)."""
    key, equals, text = setting.partition("=")
    key = key.strip()
    if not equals or not key:
        raise AutoparError(f"--config {shown(setting)}: write KEY=VALUE, e.g. "
                           "--config stall_timeout_s=120")
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = text
    return key, value


def checked(fields: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> Config:
    """The Config of ``fields`` (over the defaults), as Config's own checks
    take it; otherwise an AutoparError with Config's message, said after the
    command-line option that gave the field it names (``origins``)."""
    try:
        return Config(**fields)
    except (AutoparError, TypeError) as e:     # TypeError: a keyword Config does not have
        message = str(e)
        named = re.findall(r"Config\.(\w+)|'(\w+)'", message)
        origin = next((origins.get(a or b) or f"--config {a or b}=..." for a, b in named
                       if (a or b) in fields), "--config")
        raise AutoparError(f"{origin}: {message}") from None


def to_env(fields: Mapping[str, Any]) -> str:
    """The AUTOPAR_CONFIG value for ``fields`` (checked first)."""
    return json.dumps(dict(fields), sort_keys=True)


def apply(config: Config, environ: Mapping[str, str] = os.environ) -> Config:
    """``config`` with the fields AUTOPAR_CONFIG sets (as it is without it)."""
    text = environ.get(env.CONFIG)
    if not text:
        return config
    try:
        fields = json.loads(text)
    except ValueError:
        raise AutoparError(f"{env.CONFIG}: not a JSON object of Config fields: "
                           f"{shown(text)}") from None
    if not isinstance(fields, dict):
        raise AutoparError(f"{env.CONFIG}: not a JSON object of Config fields: {shown(text)}")
    try:
        return dataclasses.replace(config, **fields)
    except (AutoparError, TypeError) as e:
        raise AutoparError(f"{env.CONFIG} (the command line's --config): {e}") from None
